// shop.js runs the four flows against the shop instances in SHOP_URLS:
//
//   phase 1: seckill alone, so its throughput and latency measure the
//            stock lock and nothing else;
//   phase 2: balance storm, like toggles, retried orders and bursts at the
//            per-user limit together.
//
// Every scenario is an open model (a fixed arrival rate) bounded in rate,
// VUs and time, and ends by itself. Usually started by loadtest/runner;
// docs/loadtest.md shows how to run it by hand.
import { int } from './lib.js';
import * as seckill from './seckill.js';
import * as balance from './balance.js';
import * as likes from './likes.js';
import * as orders from './orders.js';
import * as limit from './limit.js';

export { purchase } from './seckill.js';
export { storm } from './balance.js';
export { toggle } from './likes.js';
export { order } from './orders.js';
export { burst } from './limit.js';

const rate = int('SHOP_RATE', 100);
const seconds = int('SHOP_DURATION', 15);
const maxVUs = int('SHOP_MAX_VUS', 400);
const flows = (__ENV.SHOP_FLOWS || 'seckill,balance,likes,orders,limit').split(',').map((f) => f.trim());
const known = ['seckill', 'balance', 'likes', 'orders', 'limit'];
for (const f of flows) {
  if (!known.includes(f)) {
    throw new Error(`SHOP_FLOWS has ${f}; want some of ${known.join(',')}`);
  }
}

function arrival(exec, perSecond, startTime) {
  const r = Math.max(1, Math.round(perSecond));
  return {
    executor: 'constant-arrival-rate',
    exec,
    rate: r,
    timeUnit: '1s',
    duration: `${seconds}s`,
    startTime,
    // A lock queue holds one VU per waiting request. VUs made mid-run
    // come too slowly on a busy machine (k6 drops iterations meanwhile),
    // so two seconds' worth are made before the start; past maxVUs an
    // iteration is dropped (dropped_iterations) rather than growing k6.
    preAllocatedVUs: Math.min(2 * r, maxVUs),
    maxVUs,
    gracefulStop: '10s',
  };
}

// Phase 2 starts after phase 1 and the seckill stragglers have drained.
const phase2 = flows.includes('seckill') ? `${seconds + 3}s` : '0s';
const plan = {
  seckill: () => arrival('purchase', rate, '0s'),
  balance: () => arrival('storm', rate / 2, phase2),
  likes: () => arrival('toggle', rate / 2, phase2),
  // Each order iteration is four requests (token, two racing sends, retry).
  orders: () => arrival('order', rate / 5, phase2),
  // Each limit iteration is a burst of per_user_limit + 2 purchases.
  limit: () => arrival('burst', rate / 10, phase2),
};
const modules = { seckill, balance, likes, orders, limit };

const scenarios = {};
let thresholds = {};
for (const f of flows) {
  scenarios[f] = plan[f]();
  thresholds = Object.assign(thresholds, modules[f].thresholds());
}

// setup runs once before the scenarios; only the limit flow needs it.
export function setup() {
  return flows.includes('limit') ? limit.setup() : {};
}

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(50)', 'p(90)', 'p(95)', 'p(99)', 'count'],
};

function fmt(values, stat) {
  const v = values ? values[stat] : undefined;
  return v === undefined ? '-' : `${v.toFixed(1)}ms`;
}

// handleSummary writes k6's whole summary as JSON to SHOP_SUMMARY for the
// runner, and a few lines to stdout (k6's own text summary would need the
// remote jslib, which is not reachable here).
export function handleSummary(data) {
  const m = data.metrics;
  const count = (name) => (m[name] ? m[name].values.count : 0);
  const lines = [
    `flows: ${flows.join(', ')}; rate ${rate}/s for ${seconds}s per phase`,
    `seckill: sold ${count('seckill_sold')}, sold out ${count('seckill_sold_out')}, busy ${count('seckill_busy')}; ` +
      `sold latency p50 ${fmt(m.seckill_sold_latency && m.seckill_sold_latency.values, 'p(50)')} ` +
      `p99 ${fmt(m.seckill_sold_latency && m.seckill_sold_latency.values, 'p(99)')}`,
    `balance: ${count('balance_changes')} changes, ${count('balance_insufficient')} refused`,
    `likes: ${count('like_toggles')} toggles`,
    `orders: ${count('orders_created')} created, ${count('orders_replayed')} replayed, ` +
      `${count('orders_in_flight')} in flight, ${count('orders_duplicate_seen')} duplicates seen`,
    `limit: ${count('limit_sold')} sold, ${count('limit_refused')} refused, ${count('limit_over_limit')} over the limit`,
    `dropped iterations: ${count('dropped_iterations')}`,
  ];
  const crossed = [];
  for (const [name, metric] of Object.entries(m)) {
    for (const [expr, t] of Object.entries(metric.thresholds || {})) {
      if (!t.ok) {
        crossed.push(`${name} ${expr}`);
      }
    }
  }
  lines.push(crossed.length ? `thresholds crossed: ${crossed.join('; ')}` : 'thresholds: all hold');
  const out = { stdout: lines.join('\n') + '\n' };
  if (__ENV.SHOP_SUMMARY) {
    out[__ENV.SHOP_SUMMARY] = JSON.stringify(data, null, 1);
  }
  return out;
}
