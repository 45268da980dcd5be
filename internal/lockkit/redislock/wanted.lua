-- refused answers a caller refused a held lock: the holder's remaining
-- lease in ms. A caller that will wait for the release message passes
-- wanted, which asks the holder's release to send one (release.lua); a
-- release that finds no mark sends nothing, so an uncontended cycle costs
-- no PUBLISH. The mark outlives the lease a little: a waiter calls again
-- when the lease runs out (a holder may renew it), and that call marks
-- again.
local function refused(lock, wanted)
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then pttl = 0 end
  if wanted then
    redis.call('SET', wanted, '1', 'PX', pttl + 1000)
  end
  return pttl
end
