// Seckill: buyers arrive at a steady rate for one hot SKU whose stock is a
// fraction of the demand. While stock lasts every purchase reads, checks and
// writes the same row: without a lock two buyers read the same stock and
// both write stock-1 (one decrement lost), and once the stock "runs out"
// the lost decrements have become units sold that never existed.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { count503, int, params, sinceStart, url, user } from './lib.js';

export const sku = __ENV.SHOP_SKU || 'lt-hot';
// SHOP_STOCK is the stock the runner gave the SKU; the client-side count
// of sales is checked against it (the audit checks the same server-side).
export const stock = int('SHOP_STOCK', 200);

const sold = new Counter('seckill_sold');
const soldOut = new Counter('seckill_sold_out');
const busy = new Counter('seckill_busy');
// seckill_sold_latency is the time a buyer who got a unit waited: the cost
// of the lock shows here (queueing behind the holders) and in how fast the
// stock sells (seckill_sold_at).
const soldLatency = new Trend('seckill_sold_latency', true);
const soldOutLatency = new Trend('seckill_sold_out_latency', true);
// seckill_sold_at is when each sale happened, from the scenario's start:
// its max is the moment the last unit sold, so sold / max is the rate at
// which the hot SKU sold while it had stock.
const soldAt = new Trend('seckill_sold_at', true);

// 409 sold out is the answer most buyers of a flash sale get: expected.
const expected = http.expectedStatuses(201, 409);

export function thresholds() {
  return {
    // More sales than stock is the oversell, seen by the clients.
    seckill_sold: [`count<=${stock}`],
    'http_req_failed{scenario:seckill}': ['rate<0.05'],
    'checks{scenario:seckill}': ['rate>0.95'],
  };
}

export function purchase() {
  const u = user(0, int('SHOP_BUYERS', 500));
  const res = http.post(
    url(`/api/v1/seckill/${sku}/purchase`),
    JSON.stringify({ quantity: 1 }),
    params(u, 'seckill purchase', expected),
  );
  if (res.status === 201) {
    sold.add(1);
    soldLatency.add(res.timings.duration);
    soldAt.add(sinceStart());
  } else if (res.status === 409) {
    soldOut.add(1);
    soldOutLatency.add(res.timings.duration);
  } else if (res.status === 503) {
    busy.add(1);
  }
  count503(res);
  check(res, { 'purchase: sold (201) or sold out (409)': (r) => r.status === 201 || r.status === 409 });
}
