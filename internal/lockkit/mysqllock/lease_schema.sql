CREATE TABLE IF NOT EXISTS {table} (
  -- Bytes, not characters: a collation would fold 'Lock:A', 'lock:a' and
  -- 'lock:a ' (PAD SPACE) into one lock, and their fences into one sequence.
  name       VARBINARY(255)  NOT NULL PRIMARY KEY,
  -- Random per grant; NULL while the key is free.
  owner      VARBINARY(64)   NULL,
  -- Raised by every grant, to at least the clock in microseconds (see
  -- lease_grant.sql). The row outlives releases, so it only rises.
  fence      BIGINT UNSIGNED NOT NULL,
  -- UTC on the database's clock; no client's clock is ever compared to it.
  expires_at DATETIME(6)     NULL
) ENGINE = InnoDB
