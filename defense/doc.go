// Package defense is the bot defense of the edge, without any HTTP
// framework: the client address behind trusted proxies, rate limits per
// user, address, address prefix and route class, a blocklist of CIDRs and
// users, proof of work at queue join, shadow mode per rule, decision
// counters, and the operator settings (PostgreSQL, audited, announced on
// Redis pub/sub) that every gateway follows within two seconds.
//
// The hot-path checks (Guard.CheckAddr, Guard.CheckUser) do no I/O, take no
// global lock and allocate nothing on the allowed path. Guard.CheckJoin
// does one Redis call when a proof-of-work solution is presented.
// The proof-of-work protocol is described in POW.md.
//
// # Fleet-wide limits
//
// Each gateway keeps its own token buckets and decides every request from
// them alone, so a refusal costs no Redis command. The buckets are kept
// in step across gateways by sharing spend (fleet.go): every allowed
// request is counted on its bucket, every ShareInterval (L) the gateway
// publishes the keys that spent and how much on the pub/sub channel
// fs:defense:spend, and every other gateway takes that spend off its own
// bucket of the same key, below zero if need be (the debt is refilled
// before the key is allowed again, and the retry delay says so). A gateway
// that holds no bucket for a key ignores its spend: the key starts full
// there when it comes, as any new key does.
//
// For a limit of rate R and burst B on N gateways, what one key gets
// through in any window of W seconds is:
//
//   - all requests on one gateway (a sticky load balancer): R·W + B, the
//     whole limit, as with one gateway; no share of it goes to the others.
//   - requests sprayed over all N: at most R·W + N·B + (N−1)·R·L, where L
//     is the share interval plus the pub/sub delivery time. Each gateway
//     can allow at most B + R·L that the others have not heard of yet;
//     the rest is the one fleet budget. Over a few seconds this is within
//     1.2 × R·W plus the bursts for L of 100-250 ms.
//
// Dividing each limit by the number of live gateways was rejected: it
// holds a sprayer to R but gives a shopper on one gateway R/N.
//
// Sharing is best effort. A lost publish or message (a Redis outage, a
// reconnecting subscriber) loses that spend, and the other gateways allow
// up to that much more; with Redis down each gateway limits on its own (N
// × R at worst) and the refusal path is unchanged.
//
// # Fleet figures
//
// Every second each gateway writes its decision counters to its own hash
// fs:defense:gw:<id>, expiring after 5 s, lists its id in the set
// fs:defense:gateways, and reads the others' hashes. Guard.Counters (the
// admin API) is the sum over the gateways whose hash is there, with each
// one's share; a gateway killed without a goodbye drops out once its hash
// expires and the others read again (at most 6 s), one stopped cleanly at
// their next read. Each key is a single untagged key and no command spans two, so
// this works on a Redis Cluster. The Prometheus metrics stay per gateway.
package defense
