-- 020: each block of the token filter (014) also records the [min, max] of its rows' received_at, the
-- writer's commit stamp. Streams interleave and ts is the agent's clock, so a block's ts range spans
-- far more rows than its own (at 2 M lines ~36 minutes, a quarter of the table for a rare phrase's 10
-- blocks); received_at follows commit order, so DuckDB's zone maps on it keep a search of an admitted
-- block to the row groups that hold its rows. Blocks written before this migration keep NULL: their
-- searches fall back to their ts range, as before.
ALTER TABLE log_blocks ADD COLUMN min_received_at TIMESTAMP;
ALTER TABLE log_blocks ADD COLUMN max_received_at TIMESTAMP;
