# Turns the output of `make bench` (rounds of `go test -bench` on
# internal/lockkit/lockbench, each round preceded by a "round N" line) into
# one table per kind.
#
# Every round runs every subject once, so A B A B ...: a drift of the
# machine's speed lands on both sides of a ratio. Each ratio is therefore
# taken inside a round (subject / peer, subject / raw round trip, the same
# minute on the same machine), and the table shows per row the median of
# the per-round ratios and their range (min-max), never a ratio of medians.
/^round [0-9]+/ { round = $2; rounds = (round > rounds ? round : rounds); next }
/^Benchmark(Uncontended|Contended)\// {
  name = $1; sub(/-[0-9]+$/, "", name)
  split(name, part, "/")
  kind = (part[1] == "BenchmarkUncontended") ? "u" : "c"; group = part[2]; subject = part[3]
  # A contended row is a server, a shape and a subject; its peer is looked
  # for in the same server and shape.
  if (kind == "c") {
    if (!(part[3] in shapeSeen)) { shapeSeen[part[3]] = 1; shapes[++nshapes] = part[3] }
    group = part[2] "/" part[3]; subject = part[4]
  }
  delete m
  for (i = 3; i < NF; i += 2) m[$(i+1)] = $i
  key = kind SUBSEP group SUBSEP subject
  if (!(key in seen)) { seen[key] = 1; order[kind, ++n[kind]] = key; kgroup[key] = group; ksubj[key] = subject }
  for (metric in m) v[key, metric, round] = m[metric]
}
# BenchmarkHerd/<recipe>/waiters-<n>: exact counts, one run.
/^BenchmarkHerd\// {
  name = $1; sub(/-[0-9]+$/, "", name)
  split(name, part, "/"); w = part[3]; sub(/^waiters-/, "", w)
  if (!(part[2] in herdSeen)) { herdSeen[part[2]] = 1; herd[++nherd] = part[2] }
  if (!(w in herdWSeen)) { herdWSeen[w] = 1; herdW[++nherdW] = w }
  for (i = 3; i < NF; i += 2) hv[part[2], w, $(i+1)] = $i
  next
}
# The peer is the first subject of a group that is not shop's own.
function peerOf(kind, group,    i, k) {
  for (i = 1; i <= n[kind]; i++) {
    k = order[kind, i]
    if (kgroup[k] == group && ksubj[k] !~ /^raw-/ && ksubj[k] !~ /^shop-/) return k
  }
  return ""
}
# Per-round ratios of (a's metric) x fa / (b's metric) x fb over the rounds
# both ran; sets med, lo, hi, cnt.
function ratios(a, ma, b, mb, mode,    r, x, y, c, s, i, j, t) {
  c = 0
  for (r = 1; r <= rounds; r++) {
    if (!((a, ma, r) in v)) continue
    x = v[a, ma, r] + 0
    if (mode == "ideal") {
      # Throughput beside 1 / (critical section + 2 round trips); the
      # ideal queue's p99 is (N - 1) of those, N waiters.
      y = v[a, "ideal-p99-ms", r] / (v[a, "waiters", r] - 1) / 1000
      if (y <= 0) continue
      s[++c] = x * y
    } else if (mode == "p99") {
      y = v[a, "ideal-p99-ms", r] + 0
      if (y <= 0) continue
      s[++c] = x / y
    } else {
      if (!((b, mb, r) in v) || v[b, mb, r] + 0 == 0) continue
      s[++c] = x / v[b, mb, r]
    }
  }
  cnt = c
  if (c == 0) return 0
  for (i = 2; i <= c; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
  lo = s[1]; hi = s[c]
  med = (c % 2) ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
  return 1
}
function cell(ok) { return ok ? sprintf("%.2f (%.2f-%.2f)", med, lo, hi) : "" }
function median1(k, metric,    r, c, s, i, j, t) {
  c = 0
  for (r = 1; r <= rounds; r++) if ((k, metric, r) in v) s[++c] = v[k, metric, r] + 0
  if (c == 0) return 0
  for (i = 2; i <= c; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
  return (c % 2) ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
}
END {
  if (!rounds) rounds = 1
  if (n["u"]) {
    print "\nUncontended: one goroutine, acquire + release on a free key; " rounds " interleaved rounds."
    print "Ratios: median of the per-round ratios (min-max over the rounds). Client CPU: the benchmark"
    print "process's user + system time per cycle (median), which the server's own time is not part of.\n"
    print "| server | subject | cycles/s (median) | × raw round trip | × peer | client CPU µs/cycle |"
    print "|---|---|---:|---:|---:|---:|"
    for (i = 1; i <= n["u"]; i++) {
      k = order["u", i]; g = kgroup[k]
      raw = "u" SUBSEP g SUBSEP "raw-roundtrip"; p = peerOf("u", g)
      xr = (ksubj[k] == "raw-roundtrip") ? "" : cell(ratios(k, "cycles/s", raw, "cycles/s"))
      xp = (p == "" || k == p || ksubj[k] ~ /^raw-/) ? "" : cell(ratios(k, "cycles/s", p, "cycles/s"))
      # shop's rows also beside every other peer of the group.
      if (ksubj[k] ~ /^shop-/) for (j = 1; j <= n["u"]; j++) {
        o = order["u", j]
        if (o != p && kgroup[o] == g && ksubj[o] !~ /^raw-/ && ksubj[o] !~ /^shop-/)
          xp = xp "; × " ksubj[o] " " cell(ratios(k, "cycles/s", o, "cycles/s"))
      }
      printf "| %s | %s | %.0f | %s | %s | %.1f |\n", g, ksubj[k], median1(k, "cycles/s"), xr, xp, median1(k, "cpu-µs/cycle")
    }
  }
  if (n["c"]) {
    print "\nContended: waiters loop acquire / 1 ms critical section / release on one key, in each shape"
    print "(processes × waiters each; a process is a client of its own, its waiters share it); " rounds " interleaved rounds."
    print "× ideal: cycles/s × (critical section + 2 round trips), 1.0 = the ideal queue's throughput;"
    print "p99 ÷ ideal: p99 wait over the ideal queue's, (N−1) × (critical section + 2 round trips), N waiters."
    print "hand-off: from a holder's release call to the next holder's Acquire returning (median of the rounds' p50 and p99),"
    print "what the lock takes from each cycle; the ideal queue's is 2 round trips. The critical section sleeps in the kernel."
    for (sh = 1; sh <= nshapes; sh++) {
      split(shapes[sh], pw, "x")
      printf "\n%s: %d process%s × %d waiter%s\n\n", shapes[sh], pw[1], (pw[1] == 1 ? "" : "es"), pw[2], (pw[2] == 1 ? "" : "s")
      print "| server | subject | cycles/s (median) | × ideal | × peer | p99 wait ms (median) | p99 ÷ ideal | max wait ms | hand-off µs p50 / p99 | gave up | fairness |"
      print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= n["c"]; i++) {
        k = order["c", i]; g = kgroup[k]
        split(g, gs, "/")
        if (gs[2] != shapes[sh]) continue
        p = peerOf("c", g)
        xi = cell(ratios(k, "cycles/s", "", "", "ideal"))
        xp = (p == "" || k == p) ? "" : cell(ratios(k, "cycles/s", p, "cycles/s"))
        xq = cell(ratios(k, "p99-ms", "", "", "p99"))
        printf "| %s | %s | %.0f | %s | %s | %.1f | %s | %.1f | %.0f / %.0f | %.0f | %.3f |\n", gs[1], ksubj[k], median1(k, "cycles/s"), xi, xp,
          median1(k, "p99-ms"), xq, median1(k, "max-ms"), median1(k, "handoff-p50-µs"), median1(k, "handoff-p99-µs"), median1(k, "gaveup"), median1(k, "fairness")
      }
    }
  }
  if (nherd) {
    print "\nZooKeeper's herd effect: what one release costs, with the waiters each a client of its own. A release"
    print "is the contended steady state: the holder deletes its node, the next waiter is granted, the old holder"
    print "queues again at the back; every step runs once the wire has settled, so these are exact counts."
    print "Cells: requests the clients sent / watch notifications they received, per release (a notification"
    print "wakes a client; parent-watch's holder also receives the one its granting listing armed).\n"
    printf "| recipe (what a waiter watches) |"
    for (j = 1; j <= nherdW; j++) printf " %s waiter%s |", herdW[j], (herdW[j] == 1 ? "" : "s")
    printf "\n|---|"
    for (j = 1; j <= nherdW; j++) printf "---:|"
    printf "\n"
    for (i = 1; i <= nherd; i++) {
      r = herd[i]
      printf "| %s (%s) |", r, (r == "parent-watch" ? "the lock's directory" : "the node ahead")
      for (j = 1; j <= nherdW; j++)
        printf " %g / %g |", hv[r, herdW[j], "requests/release"], hv[r, herdW[j], "wakeups/release"]
      printf "\n"
    }
  }
}
