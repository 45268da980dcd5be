// Like/unlike toggles: users like and unlike a few hot entities, and every
// tap is sent twice at once, to two instances (a double tap, or a client
// that retries without waiting). An entity's set of likers and its owner's
// received-likes counter live in different hash slots of a Redis Cluster,
// so no transaction spans them: without the lock both copies see "not
// liked yet", both add one to the counter, and the counter drifts from the
// set. Likes of different users never conflict (SADD and INCR are atomic
// each); only the same user's racing toggles do, hence the double tap.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { count503, int, params, url, user } from './lib.js';

export const likeType = __ENV.SHOP_LIKE_TYPE || 'post';
const entities = int('SHOP_LIKE_ENTITIES', 2);
const firstEntity = int('SHOP_LIKE_FIRST_ENTITY', 1);
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
  const like = Math.random() < 0.5;
  const p = params(u, like ? 'like' : 'unlike', expected);
  const method = like ? 'PUT' : 'DELETE';
  const answers = http.batch([
    [method, url(path), null, p],
    [method, url(path, 1), null, p],
  ]);
  for (const res of answers) {
    latency.add(res.timings.duration);
    if (res.status >= 200 && res.status <= 204) {
      toggles.add(1);
    }
    count503(res);
    check(res, { 'like: answered 2xx': (r) => r.status >= 200 && r.status <= 204 });
  }
}
