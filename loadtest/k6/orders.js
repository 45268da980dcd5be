// Orders with retried idempotency keys and payments: each iteration is a
// flaky client. It takes a one-time token, sends its order, and without
// waiting for the answer (as if its connection had dropped) sends the same
// request again at once; then, later, a third time. The first two race
// inside the service: the idempotency guard must let exactly one create the
// order and answer the other 409 (in flight) or with the stored response;
// the third must get the stored response back, marked as a replay.
//
// Then the order's fate: a third of the orders are paid at creation
// ("pay": true), a third are paid afterwards by two pay requests racing on
// two instances (one debit, both answered the same paid order), and a
// third are left unpaid for the closer to cancel once
// SHOP_ORDER_PAY_TIMEOUT has passed. The audit reconciles every order with
// its debit and its stock.
import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';
import { Counter, Trend } from 'k6/metrics';
import { count503, int, params, url, user } from './lib.js';

export const orderSKU = __ENV.SHOP_ORDER_SKU || 'lt-order';
const firstBuyer = int('SHOP_FIRST_ORDER_BUYER', 101);
const buyers = int('SHOP_ORDER_BUYERS', 200);
const replayHeader = __ENV.SHOP_REPLAY_HEADER || 'Idempotent-Replayed';

const created = new Counter('orders_created');
const replayed = new Counter('orders_replayed');
const inFlight = new Counter('orders_in_flight');
// Which guard answered the racing duplicate: the idempotency layer's
// in-flight lock (idempotency-key-in-use), or, when that lock let both
// through, the order's unique (user, key) row (order-in-progress).
const inFlightLock = new Counter('orders_409_lock');
const inFlightRow = new Counter('orders_409_unique_row');
// orders_duplicate_seen counts orders beyond the first that one key
// produced, as the client sees them (different order ids for one key).
const duplicates = new Counter('orders_duplicate_seen');
const latency = new Trend('orders_latency', true);
// The fate of each order: paid at creation, paid afterwards, left unpaid.
const paidAtOnce = new Counter('orders_paid_at_creation');
const paidLater = new Counter('orders_paid_later');
const leftUnpaid = new Counter('orders_left_unpaid');
// A pay answered 409 order-cancelled (the closer was first) or
// payment-too-late (the deadline passed, and the pay cancelled it).
const payTooLate = new Counter('orders_pay_cancelled');
// Two racing pays of one order answered different orders: a pay is not
// idempotent (safety, like orders_duplicate_seen).
const payMismatch = new Counter('orders_pay_mismatch');

// 409: the same key is still in flight, which the concurrent retry hits
// on purpose; for a pay, the order was cancelled first.
const expected = http.expectedStatuses(200, 201, 409);
const tokenExpected = http.expectedStatuses(200, 201);

export function thresholds() {
  return {
    orders_duplicate_seen: ['count==0'],
    orders_pay_mismatch: ['count==0'],
    'http_req_failed{scenario:orders}': ['rate<0.05'],
    'checks{scenario:orders}': ['rate>0.95'],
  };
}

function orderID(res) {
  try {
    const b = res.json();
    return b.order_id !== undefined ? String(b.order_id) : b.id !== undefined ? String(b.id) : '';
  } catch (_) {
    return '';
  }
}

function problemType(res) {
  try {
    return String(res.json('type') || '');
  } catch (_) {
    return '';
  }
}

function isReplay(res) {
  return (res.headers[replayHeader] || '').toLowerCase() === 'true';
}

export function order() {
  const u = user(firstBuyer - 1, buyers);
  const tok = http.post(url('/api/v1/idempotency-tokens'), null, params(u, 'idempotency token', tokenExpected));
  let key = '';
  try {
    const b = tok.json();
    key = b.token || b.key || '';
  } catch (_) {
    key = '';
  }
  if (!check(tok, { 'token: issued': () => key !== '' })) {
    return;
  }
  // The iteration number picks the fate, so the thirds are exact.
  const fate = exec.scenario.iterationInTest % 3; // 0: pay at once, 1: pay later, 2: leave unpaid
  const body = JSON.stringify(fate === 0 ? { sku: orderSKU, quantity: 1, pay: true } : { sku: orderSKU, quantity: 1 });
  const p = params(u, 'order', expected, { 'Idempotency-Key': key });
  // Each copy goes to another instance, as behind a load balancer.
  const first = http.batch([
    ['POST', url('/api/v1/orders'), body, p],
    ['POST', url('/api/v1/orders', 1), body, p],
  ]);
  const retry = http.post(url('/api/v1/orders', 2), body, p);

  const ids = new Set();
  for (const res of [...first, retry]) {
    latency.add(res.timings.duration);
    count503(res);
    if (res.status === 409) {
      inFlight.add(1);
      const type = problemType(res);
      if (type.endsWith('idempotency-key-in-use')) {
        inFlightLock.add(1);
      } else if (type.endsWith('order-in-progress')) {
        inFlightRow.add(1);
      }
      continue;
    }
    if (res.status !== 200 && res.status !== 201) {
      continue;
    }
    if (isReplay(res)) {
      replayed.add(1);
    } else {
      created.add(1);
    }
    const id = orderID(res);
    if (id !== '') {
      ids.add(id);
    }
  }
  if (ids.size > 1) {
    duplicates.add(ids.size - 1);
  }
  check(first[0], { 'order: created, replayed or in flight': (r) => [200, 201, 409].includes(r.status) });
  check(first[1], { 'order: created, replayed or in flight': (r) => [200, 201, 409].includes(r.status) });
  check(retry, {
    'order: the later retry is a replay': (r) => (r.status === 200 || r.status === 201) && isReplay(r),
  });
  const id = [...ids][0];
  if (id === undefined) {
    return;
  }
  if (fate === 0) {
    paidAtOnce.add(1);
  } else if (fate === 2) {
    leftUnpaid.add(1);
  } else {
    pay(u, id);
  }
}

// pay sends two pays of one order at once to two instances: one debit, and
// both answer the same paid order (or both 409 if the closer was first).
function pay(u, id) {
  const p = params(u, 'pay', expected);
  const path = `/api/v1/orders/${id}/pay`;
  const both = http.batch([
    ['POST', url(path), null, p],
    ['POST', url(path, 1), null, p],
  ]);
  const paid = [];
  for (const res of both) {
    latency.add(res.timings.duration);
    count503(res);
    if (res.status === 200) {
      paid.push(res.body);
    } else if (res.status === 409 && /(order-cancelled|payment-too-late)$/.test(problemType(res))) {
      payTooLate.add(1);
    }
  }
  if (paid.length === 2 && paid[0] !== paid[1]) {
    payMismatch.add(1);
  }
  if (paid.length > 0) {
    paidLater.add(1);
  }
  check(both[0], { 'pay: paid, or cancelled first, or busy': (r) => [200, 409, 503].includes(r.status) });
}
