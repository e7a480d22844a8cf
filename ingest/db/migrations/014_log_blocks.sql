-- 014: the token filter of fleet-wide search (ingest/db/searchtokens.py). Each block is a run of at most 8,192
-- log rows in commit order, written by the writer in the same commit as its rows: the ts range of its
-- rows and a bitset of 26^3 bits, one per letter trigram its lines hold (bit (a*676 + b*26 + c) for the
-- letters a, b, c numbered from 0). A search reads only the ts ranges of the blocks holding every
-- trigram of its text. The rows stored before this migration go into block 0 with every bit set:
-- searches over them scan, as before.
CREATE TABLE log_blocks (
    block    BIGINT NOT NULL,
    min_ts   TIMESTAMP NOT NULL,
    max_ts   TIMESTAMP NOT NULL,
    lines    BIGINT NOT NULL,
    bits     BIT NOT NULL
);
INSERT INTO log_blocks SELECT 0, min(ts), max(ts), count(*), repeat('1', 17576)::BIT FROM logs HAVING count(*) > 0;
