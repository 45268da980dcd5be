-- Grant, sent as one multi-statement round trip on the lease's own
-- connection, with these whole-line comments stripped. Parameters: name,
-- name, name, name, wait_timeout in seconds, interpolated by the driver.
--
-- The first result names this session, and is read before the wait: a
-- waiter whose Acquire is cancelled is KILLed from another connection,
-- because a client that merely hangs up stays queued on the row lock, and
-- is even granted it, until the server next writes to it.
SELECT CONNECTION_ID();
-- No gap locks. The row used to be locked by an INSERT ... ON DUPLICATE
-- KEY inside the lease's transaction; under REPEATABLE READ that insert
-- and its waiters' duplicate checks took next-key locks, and inserts of
-- other new names into those gaps queued behind a lease held for minutes
-- (the order closer's leader lease): TestHolderFaults/mysql-forupdate
-- hung 60 s.
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
-- The row, created and committed outside the lease's transaction when
-- missing (the NOT EXISTS is a consistent read under READ COMMITTED: it
-- does not wait for a holder), so the transaction below locks one
-- existing record and no gap. Rows are never deleted.
INSERT IGNORE INTO {table} (name) SELECT ? FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE name = ?);
START TRANSACTION;
-- The row lock. It waits while another transaction holds the row; the pool sets
-- innodb_lock_wait_timeout to its maximum, so only the caller's context
-- (through KILL) ends the wait. TryAcquire's copy replaces the marker with
-- SET STATEMENT innodb_lock_wait_timeout = 0 FOR: error 1205 at once
-- instead of a wait.
/*{nowait}*/ SELECT name INTO @shop_row_lock FROM {table} WHERE name = ? FOR UPDATE;
-- A label, not a lock: IS_USED_LOCK(SHA1(name)) tells an operator which
-- session to KILL. (Lock names are limited to 64 characters.)
DO GET_LOCK(SHA1(?), 0);
-- From here on the server ends the lease by itself: a session idle for
-- this many seconds is closed and its transaction rolled back. Each
-- Extend sets it again, which also restarts the idle clock.
SET SESSION wait_timeout = ?;
-- The fence. Drawn after the row lock is granted, fences follow grant
-- order. Drawn from a sequence rather than from a counter in the row, a
-- grant whose transaction dies (killed, timed out) keeps its number, so
-- the next grant's is greater: a counter's bump would be rolled back and
-- handed out twice.
SELECT NEXT VALUE FOR {seq}
