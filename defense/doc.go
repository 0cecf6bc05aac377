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
package defense
