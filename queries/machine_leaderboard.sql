-- machine_leaderboard: machines by best benchmark rate, with runs and dollars per proof (cheapest
--   first among equals), and whether they are bad or eligible now.
-- params: $min_rate (proofs/hour)
-- needs: host_performance, hosts
SELECT machine_id, gpu_model, best_rate, runs, failed_runs, round(dollars_per_proof, 4) AS dollars_per_proof,
       bad, eligible, reason
FROM hosts
ORDER BY best_rate DESC NULLS LAST, dollars_per_proof NULLS LAST, machine_id
