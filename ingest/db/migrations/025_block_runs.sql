-- 025: the token filter's blocks (014) transposed, a run of RUN_BLOCKS consecutive blocks at a time
-- (ingest/db/searchtokens.py). At 100 M lines a search tested the bits of each of the window's 48,829
-- blocks (~107 MB read: 8x its 10 M cost for a common word); a closed run keeps, for each trigram that
-- any of its blocks holds, one bitset of its blocks (bit i: block first_block + i holds the trigram), so a
-- search reads its trigrams' rows, one per run, ANDs them, and reads the blocks' bits only for the run
-- still open. The writer writes a run in the commit that stores its last block; log_blocks keeps the
-- bits (the open run's, and the truth a run is rebuilt from).
CREATE TABLE log_block_runs (
    run          INTEGER NOT NULL,
    first_block  BIGINT NOT NULL,
    last_block   BIGINT NOT NULL,
    min_ts       TIMESTAMP,  -- the ts range of its blocks' (NULL: none stored): a run inside the window counts its
    max_ts       TIMESTAMP   -- admitted blocks by its bits alone
);
CREATE TABLE log_block_grams (
    run     INTEGER NOT NULL,
    gram    SMALLINT NOT NULL,
    blocks  BIT NOT NULL
);
