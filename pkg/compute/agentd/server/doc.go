// Package server is sandbox-agentd's gRPC shim over package agentd: it
// serves the bulkhead.agentd.v1 services (plus grpc.health.v1 and
// reflection), authenticates every call but health with the sandbox token
// (optionally over mTLS), and maps agentd's Go errors to gRPC status codes.
// Run is what the daemon's main calls. With Config.MetricsListen
// (--metrics-listen, off by default) it also times every call by method and
// code and counts bytes streamed and refused tokens (package metrics),
// served as Prometheus text on an unauthenticated listener of its own.
package server
