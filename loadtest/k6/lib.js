// What every flow shares: where the shop instances are, who the users are,
// and how a request picks an instance. Everything comes from environment
// variables that loadtest/runner sets (docs/loadtest.md lists them), so a
// script can also be run by hand against instances you started yourself.
import exec from 'k6/execution';
import { SharedArray } from 'k6/data';
import { Counter } from 'k6/metrics';

// SHOP_URLS: comma-separated base URLs of the instances. Only loopback is
// accepted: these scripts hammer a hot key on purpose and must never be
// pointed at a machine someone else depends on by a typo.
export const baseURLs = (__ENV.SHOP_URLS || 'http://127.0.0.1:8080')
  .split(',')
  .map((u) => u.trim().replace(/\/+$/, ''))
  .filter((u) => u !== '');

const loopback = /^http:\/\/(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\])(:\d{1,5})?$/;
for (const u of baseURLs) {
  if (!loopback.test(u)) {
    throw new Error(`SHOP_URLS has ${u}: only http://127.x.x.x, localhost or [::1] are allowed`);
  }
}

// SHOP_TOKENS: a JSON file [{"user": 1, "token": "<JWT>"}, ...] that the
// runner writes before the run (k6 has no HS256 without a remote jslib).
// A SharedArray is parsed once and shared by every VU, not copied into each.
export const users = new SharedArray('users', () => {
  const path = __ENV.SHOP_TOKENS;
  if (!path) {
    throw new Error('SHOP_TOKENS is unset: point it at the tokens file loadtest/runner writes');
  }
  const list = JSON.parse(open(path));
  if (!Array.isArray(list) || list.length === 0) {
    throw new Error(`${path} holds no users`);
  }
  return list;
});

// int reads a positive integer variable.
export function int(name, def) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') {
    return def;
  }
  const n = Number(raw);
  if (!Number.isInteger(n) || n <= 0) {
    throw new Error(`${name} is ${raw}; want a positive integer`);
  }
  return n;
}

// url spreads requests over the instances: each VU starts on another
// instance and moves on at every iteration, so a hot key is contended from
// every process at once, which is what a per-process lock cannot see.
// shift sends a request of the same iteration to the next instance(s).
export function url(path, shift) {
  const i = (exec.vu.idInTest + exec.vu.iterationInScenario + (shift || 0)) % baseURLs.length;
  return baseURLs[i] + path;
}

// user returns a user (id and token) drawn from users[from, from+count).
export function user(from, count) {
  const n = Math.min(count, users.length - from);
  if (n <= 0) {
    throw new Error(`users ${from}..${from + count} are not in SHOP_TOKENS (${users.length} users)`);
  }
  return users[from + Math.floor(Math.random() * n)];
}

// userByID returns the user whose id is id.
export function userByID(id) {
  const u = users[id - 1];
  if (!u || u.user !== id) {
    throw new Error(`user ${id} is not at index ${id - 1} of SHOP_TOKENS`);
  }
  return u;
}

export function params(u, name, expected, extraHeaders) {
  return {
    headers: Object.assign(
      { Authorization: `Bearer ${u.token}`, 'Content-Type': 'application/json' },
      extraHeaders || {},
    ),
    tags: { name },
    responseCallback: expected,
    // A request stuck longer than this is an answer too (a failure): no
    // iteration may outlive the scenario's bounds.
    timeout: '20s',
  };
}

// sinceStart is the time since this scenario began, in milliseconds.
export function sinceStart() {
  return Date.now() - exec.scenario.startTime;
}

// A 503 is either a lock that stayed busy for the whole wait (lock-busy) or
// a write the store refused because a later lock holder had written first
// (fenced): the second is a broken lock caught by its fence, which is worth
// counting apart. Both changed nothing.
const fenced = new Counter('refused_fenced');
const lockBusy = new Counter('refused_lock_busy');

export function count503(res) {
  if (res.status !== 503) {
    return;
  }
  let type = '';
  try {
    type = String(res.json('type') || '');
  } catch (_) {
    type = '';
  }
  if (type.endsWith('fenced')) {
    fenced.add(1);
  } else if (type.endsWith('lock-busy')) {
    lockBusy.add(1);
  }
}
