// Like/unlike toggles: many users like and unlike a few hot entities. An
// entity's set of likers and its owner's received-likes counter live in
// different hash slots of a Redis Cluster, so no transaction spans them:
// without the lock two toggles by the same user both see "not liked yet",
// both add one to the counter, and the counter drifts from the set.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { int, params, url, user } from './lib.js';

export const likeType = __ENV.SHOP_LIKE_TYPE || 'post';
const entities = int('SHOP_LIKE_ENTITIES', 2);
const firstEntity = int('SHOP_LIKE_FIRST_ENTITY', 1);
// A small pool of likers makes the same user toggle the same entity from
// two instances at once often: that is the race the lock closes.
const likers = int('SHOP_LIKERS', 40);
const firstLiker = int('SHOP_FIRST_LIKER', 11);

const toggles = new Counter('like_toggles');
const latency = new Trend('like_latency', true);

const expected = http.expectedStatuses({ min: 200, max: 204 });

export function thresholds() {
  return {
    'http_req_failed{scenario:likes}': ['rate<0.05'],
    'checks{scenario:likes}': ['rate>0.95'],
  };
}

export function toggle() {
  const u = user(firstLiker - 1, likers);
  const id = firstEntity + Math.floor(Math.random() * entities);
  const path = `/api/v1/likes/${likeType}/${id}`;
  const p = params(u, Math.random() < 0.55 ? 'like' : 'unlike', expected);
  const res = p.tags.name === 'like' ? http.put(url(path), null, p) : http.del(url(path), null, p);
  latency.add(res.timings.duration);
  if (res.status >= 200 && res.status <= 204) {
    toggles.add(1);
  }
  check(res, { 'like: answered 2xx': (r) => r.status >= 200 && r.status <= 204 });
}
