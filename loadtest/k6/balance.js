// Balance storm: deposits, withdrawals and a few transfers on a handful of
// hot accounts. The service computes each new balance in Go (read, add,
// write), so without a lock two changes read the same balance and the
// second write erases the first: a lost update. Every change also inserts a
// ledger row that cannot be lost, which is how the audit counts the drift.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { count503, int, params, url, userByID } from './lib.js';

// SHOP_HOT_ACCOUNTS accounts 1..n take all the traffic.
const hot = int('SHOP_HOT_ACCOUNTS', 3);

const changes = new Counter('balance_changes');
const insufficient = new Counter('balance_insufficient');
const latency = new Trend('balance_latency', true);

// 422 insufficient funds is a correct answer to a withdrawal, not a failure.
const expected = http.expectedStatuses(200, 422);

export function thresholds() {
  return {
    'http_req_failed{scenario:balance}': ['rate<0.05'],
    'checks{scenario:balance}': ['rate>0.95'],
  };
}

export function storm() {
  const id = 1 + Math.floor(Math.random() * hot);
  const u = userByID(id);
  const amount = 1 + Math.floor(Math.random() * 500);
  const dice = Math.random();
  let res;
  if (dice < 0.45) {
    res = http.post(url(`/api/v1/accounts/${id}/deposit`), JSON.stringify({ amount_cents: amount }),
      params(u, 'balance deposit', expected));
  } else if (dice < 0.9 || hot < 2) {
    res = http.post(url(`/api/v1/accounts/${id}/withdraw`), JSON.stringify({ amount_cents: amount }),
      params(u, 'balance withdraw', expected));
  } else {
    // Transfers lock both accounts; opposite directions at once are what
    // ordered multi-key acquisition keeps from deadlocking.
    const to = 1 + ((id - 1 + 1 + Math.floor(Math.random() * (hot - 1))) % hot);
    res = http.post(url('/api/v1/transfers'), JSON.stringify({ from: id, to, amount_cents: amount }),
      params(u, 'balance transfer', expected));
  }
  latency.add(res.timings.duration);
  if (res.status === 200) {
    changes.add(1);
  } else if (res.status === 422) {
    insufficient.add(1);
  }
  count503(res);
  check(res, { 'balance: changed (200) or refused (422)': (r) => r.status === 200 || r.status === 422 });
}
