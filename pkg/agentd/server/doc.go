// Package server is sandbox-agentd's gRPC shim over package agentd: it
// serves the bulkhead.agentd.v1 services (plus grpc.health.v1 and
// reflection), authenticates every call but health with the sandbox token
// (optionally over mTLS), and maps agentd's Go errors to gRPC status codes.
// Run is what the daemon's main calls. With Config.MetricsListen
// (--metrics-listen, off by default) it also times every call by method and
// code and counts bytes streamed and refused tokens (package metrics),
// served as Prometheus text on an unauthenticated listener of its own.
//
// Each listener keeps at most Config.MaxConnections connections open and
// closes one that has not made a call with the token within
// Config.HandshakeTimeout, or that makes more than 32 calls without it
// (connLimiter), so that connections alone, made by anyone who can reach
// the address, hold a bounded amount of memory.
//
// SystemService.RotateToken replaces the token at run time (a warm pool
// hands each claimed sandbox a fresh one, so the token the sandbox was
// started with is useless afterwards). It is authenticated with the current
// token; from its return on, every new call must carry the new one.
// Streams authenticated before the rotation (an Attach, an Exec, a port
// forward) are not cut and keep running to their end. Only a SHA-256
// digest of the token is held; neither tokens nor their digests are
// logged or quoted in errors.
package server
