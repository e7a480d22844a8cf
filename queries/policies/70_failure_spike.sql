-- rule: failure_spike
-- decides: alert on a spike: spike_failures failures of one class on one GPU model within spike_window_s
--   (the failure_spikes view, migration 018); one decision per (class on GPU model, episode), notified once.
-- params: $now (timestamp), $public_url (the page's base URL)
-- output: decisions (subject = '<class> on <GPU model>', action = alert)
-- An episode is decided while it is up or for one window after it fell (a cycle that came late still
-- tells), never one in the past. The decision is recorded as executed; the server POSTs it to
-- --notify-webhook-url as event "alert" when it is decided, with evidence.link: the page's failures view
-- of exactly those failures. The decision follows its episode (a later failure counts in its evidence,
-- nobody is told again); an episode whose start moved (a failure classed late, from before the one it
-- began at) keeps the key of the held decision it overlaps.
WITH up AS (
    SELECT s.*, s.failure_class || ' on ' || s.gpu_model AS subject
    FROM failure_spikes s
    WHERE s.started_at <= $now::TIMESTAMP AND s.ended_at + to_seconds(s.window_s) >= $now::TIMESTAMP
),
held AS (
    SELECT subject, episode, TRY_CAST(evidence->>'started_at' AS TIMESTAMP) AS started_at,
           TRY_CAST(evidence->>'ended_at' AS TIMESTAMP) AS ended_at
    FROM decisions WHERE rule = 'failure_spike' AND action = 'alert'
),
keyed AS (
    SELECT u.*,
           coalesce((SELECT min(h.episode) FROM held h WHERE h.subject = u.subject
                     AND h.started_at <= u.ended_at AND h.ended_at >= u.started_at),
                    strftime(u.started_at, '%Y-%m-%dT%H:%M:%S.%fZ')) AS episode,
           '#/failures?class=' || url_encode(u.failure_class) || '&gpu=' || url_encode(u.gpu_model)
               || '&since=' || strftime(date_trunc('second', u.first_failed_at), '%Y-%m-%dT%H:%M:%S')
               || '&until=' || strftime(date_trunc('second', u.last_failed_at)
                                        + CASE WHEN u.last_failed_at > date_trunc('second', u.last_failed_at)
                                               THEN INTERVAL 1 SECOND ELSE INTERVAL 0 SECOND END, '%Y-%m-%dT%H:%M:%S')
               AS page
    FROM up u
)
SELECT subject,
       'alert' AS action,
       format('{} {} failures on {} within {} s ({} machines, the first at {} UTC, {} spent on them)',
              failures, failure_class, gpu_model, window_s::BIGINT, machines, strftime(first_failed_at, '%Y-%m-%d %H:%M:%S'),
              coalesce(printf(CASE WHEN cost_usd < 0.01 THEN '$%.4f' ELSE '$%.2f' END, cost_usd), 'an unknown sum')) AS reason,
       json_object('failure_class', failure_class, 'gpu_model', gpu_model, 'failures', failures, 'machines', machines,
                   'instances', instances, 'threshold', threshold, 'window_s', window_s,
                   'first_failed_at', first_failed_at, 'last_failed_at', last_failed_at,
                   'started_at', started_at, 'ended_at', ended_at, 'cost_usd', round(cost_usd, 4),
                   'page', page, 'link', $public_url || '/' || page) AS evidence,
       episode,
       NULL::TIMESTAMP AS expires_at
FROM keyed
ORDER BY started_at, subject
