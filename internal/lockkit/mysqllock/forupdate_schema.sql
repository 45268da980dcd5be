-- A row exists only to be locked: nothing is written to it after it is
-- created, so a grant's commit has nothing to flush to the redo log.
-- Bytes, not characters: no collation folds two keys into one lock.
CREATE TABLE IF NOT EXISTS {table} (
  name VARBINARY(255) NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
-- The fences. Sequences are not transactional: a number drawn by a
-- transaction that is later rolled back stays used. NOCACHE is not needed:
-- after a crash the server skips the rest of its cache, it never reissues
-- a number.
CREATE SEQUENCE IF NOT EXISTS {seq}
