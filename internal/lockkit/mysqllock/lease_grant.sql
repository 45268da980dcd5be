-- Grant: create the key's row, or take it over when it is free or expired.
-- One statement, so one round trip, and atomic under the row's lock.
--
-- Parameters: name, owner, TTL in microseconds.
--
-- The answer is the statement's LAST_INSERT_ID: the new fence when this
-- owner was granted, 0 when someone else holds the key. The table has no
-- AUTO_INCREMENT column; LAST_INSERT_ID(x) only sets the value the server
-- reports back for this statement.
--
-- Assignments run left to right and each sees the ones before: owner is
-- decided first, from the old row, and the other two columns follow from
-- whether owner is now ours (a fresh random token can match nothing else).
-- UTC_TIMESTAMP(6) is read once per statement, and unlike NOW(6) does not
-- depend on the session's time_zone, which two clients may set differently.
--
-- The fence is the larger of the row's last fence + 1 and the database's
-- clock in microseconds since 1970. The +1 makes each grant beat the one
-- before; the clock makes a row that was deleted (by hand, a restore, a
-- truncated table) start again above every token it gave before, as long
-- as the database's clock has not stepped back by more than the time since
-- that token: without it the row would restart at 1 and the stores, which
-- keep the highest fence they saw, would refuse its holders for good.
INSERT INTO {table} (name, owner, fence, expires_at)
VALUES (?, ?, LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))),
        UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  owner      = IF(owner IS NULL OR expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner),
  fence      = IF(owner = VALUES(owner),
                  LAST_INSERT_ID(GREATEST(fence + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)))),
                  fence + LAST_INSERT_ID(0)),
  expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)
