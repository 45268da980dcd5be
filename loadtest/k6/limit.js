// Per-user limit: the limited SKU of the loadtest fixture sells at most
// per_user_limit units to each user. Each iteration is a user of its own
// who sends per_user_limit + 2 purchases at once, spread over the
// instances. The limit is one conditional UPDATE of the user's total in
// the sale's transaction, so whatever the lock (none included) at most the
// limit sells; every unit past it is counted in limit_over_limit.
import http from 'k6/http';
import exec from 'k6/execution';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { baseURLs, count503, params, url, users } from './lib.js';

export const sku = __ENV.SHOP_LIMITED_SKU || 'lt-limited';

const sold = new Counter('limit_sold');
const overLimit = new Counter('limit_over_limit');
const refused = new Counter('limit_refused');

// 409 is the limit (or sold out): the answer most of each burst expects.
const expected = http.expectedStatuses(201, 409);

export function thresholds() {
  return {
    limit_over_limit: ['count==0'],
    'http_req_failed{scenario:limit}': ['rate<0.05'],
    'checks{scenario:limit}': ['rate>0.95'],
  };
}

// setup reads the SKU's limit and stock from the service, so that the
// fixture stays their one source. A burst is limit + 2 purchases, and only
// as many users burst as the stock serves whole even if the limit failed:
// past that, sold-out answers would hide a broken limit.
export function setup() {
  const res = http.get(`${baseURLs[0]}/api/v1/products/${sku}`, params(users[0], 'limit product'));
  if (res.status !== 200) {
    throw new Error(`GET /api/v1/products/${sku}: ${res.status} ${res.body}`);
  }
  const limit = res.json('per_user_limit');
  const stock = res.json('stock');
  if (!(limit > 0)) {
    throw new Error(`${sku} has no per-user limit; the loadtest fixture gives it one`);
  }
  const burst = limit + 2;
  return { limit, burst, users: Math.min(users.length, Math.floor(stock / burst)) };
}

export function burst(data) {
  const n = exec.scenario.iterationInTest;
  if (n >= data.users) {
    return;
  }
  // Users from the end of the list: the other flows favour the first ones.
  const u = users[users.length - 1 - n];
  const body = JSON.stringify({ quantity: 1 });
  const reqs = [];
  for (let i = 0; i < data.burst; i++) {
    reqs.push(['POST', url(`/api/v1/seckill/${sku}/purchase`, i), body, params(u, 'limit purchase', expected)]);
  }
  let got = 0;
  for (const res of http.batch(reqs)) {
    if (res.status === 201) {
      got++;
    } else if (res.status === 409) {
      refused.add(1);
    }
    count503(res);
    check(res, { 'limit: sold (201) or refused (409)': (r) => r.status === 201 || r.status === 409 });
  }
  sold.add(got);
  overLimit.add(Math.max(0, got - data.limit));
}
