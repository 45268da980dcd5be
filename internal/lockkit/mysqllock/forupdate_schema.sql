CREATE TABLE IF NOT EXISTS {table} (
  -- Bytes, not characters: no collation folds two keys into one lock.
  name   VARBINARY(255)  NOT NULL PRIMARY KEY,
  -- The last committed grant's fence, for people reading the table. The
  -- fence itself comes from the sequence below.
  fence  BIGINT UNSIGNED NOT NULL,
  -- CONNECTION_ID() of the session holding the row, written inside the
  -- lock transaction and cleared before its COMMIT: committed rows say
  -- NULL, and a READ UNCOMMITTED reader sees the current holder. That is
  -- how an operator finds whom to KILL.
  holder BIGINT UNSIGNED NULL
) ENGINE = InnoDB;
-- Sequences are not transactional: a number drawn by a transaction that is
-- later rolled back stays used. NOCACHE is not needed: after a crash the
-- server skips the rest of its cache, it never reissues a number.
CREATE SEQUENCE IF NOT EXISTS {seq}
