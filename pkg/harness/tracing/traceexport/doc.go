// Package traceexport builds the OpenTelemetry trace providers that export
// the harness's spans (package tracing): OTLP over HTTP/protobuf to a
// collector, or stdout as JSON for local debugging. It is apart from
// package tracing so that a program embedding the harness links the
// OpenTelemetry SDK and its exporters only if it imports this package (or
// brings a provider of its own).
//
//	tp, shutdown, err := traceexport.NewProvider(ctx, traceexport.Config{Exporter: traceexport.ExporterOTLP})
//	defer shutdown(ctx)
//	runner := &harness.Runner{TracerProvider: tp}
package traceexport
