package traceexport

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
)

// Exporter names accepted by Config.Exporter.
const (
	ExporterNone   = "none"
	ExporterOTLP   = "otlp"
	ExporterStdout = "stdout"
)

// DefaultServiceName is the service.name of the harness's traces when
// neither Config.ServiceName nor OTEL_SERVICE_NAME says otherwise.
const DefaultServiceName = "bulkhead"

// Config says where traces go.
type Config struct {
	// Exporter is "otlp" (OTLP over HTTP/protobuf), "stdout" (spans as
	// JSON, for local debugging) or "none"/"" (nothing is recorded).
	Exporter string
	// Endpoint is, for otlp, the collector: a URL ("http://host:4318", a
	// path other than "/" is used as given, else "/v1/traces") or
	// "host:port" (HTTPS unless Insecure). Empty means the standard
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables, else localhost:4318.
	Endpoint string
	// Insecure sends to a "host:port" Endpoint over plain HTTP.
	Insecure bool
	// Headers are sent with every export (a collector's API key). They
	// are credentials of the harness: never recorded anywhere.
	Headers map[string]string
	// ServiceName is the resource's service.name; empty means
	// OTEL_SERVICE_NAME, else DefaultServiceName.
	ServiceName string
	// Sampler decides which traces are kept; nil means the SDK's default
	// (parent-based, always on; OTEL_TRACES_SAMPLER is honoured).
	Sampler sdktrace.Sampler
	// Writer receives the stdout exporter's spans; nil means os.Stderr
	// (stdout is left to the program's own output).
	Writer io.Writer
}

// NewProvider builds the trace provider cfg describes, and the function
// that flushes and stops it (call it before the program exits; it is safe
// to call more than once). With "none" the provider records nothing. The
// provider is not installed globally: pass it to tracing.New (or
// harness.Runner.TracerProvider), to compute.ClientOptions.TracerProvider
// and agentclient.Options, or call otel.SetTracerProvider yourself.
func NewProvider(ctx context.Context, cfg Config) (trace.TracerProvider, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	sync := false
	switch strings.ToLower(strings.TrimSpace(cfg.Exporter)) {
	case "", ExporterNone:
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	case ExporterStdout:
		w := cfg.Writer
		if w == nil {
			w = os.Stderr
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(w))
		sync = true
	case ExporterOTLP:
		var opts []otlptracehttp.Option
		if opts, err = otlpOptions(cfg); err == nil {
			exp, err = otlptracehttp.New(ctx, opts...)
		}
	default:
		return nil, nil, fmt.Errorf("tracing: unknown exporter %q (want %s, %s or %s)", cfg.Exporter, ExporterOTLP, ExporterStdout, ExporterNone)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %s exporter: %w", cfg.Exporter, err)
	}
	res, err := newResource(ctx, cfg.ServiceName)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if sync {
		opts = append(opts, sdktrace.WithSyncer(exp))
	} else {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if cfg.Sampler != nil {
		opts = append(opts, sdktrace.WithSampler(cfg.Sampler))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tp, tp.Shutdown, nil
}

func otlpOptions(cfg Config) ([]otlptracehttp.Option, error) {
	var opts []otlptracehttp.Option
	if ep := strings.TrimSpace(cfg.Endpoint); ep != "" {
		if strings.Contains(ep, "://") {
			u, err := url.Parse(ep)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("endpoint %q: want http(s)://host:port[/path] or host:port", ep)
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		} else {
			opts = append(opts, otlptracehttp.WithEndpoint(ep))
			if cfg.Insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
	}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	return opts, nil
}

func newResource(ctx context.Context, serviceName string) (*resource.Resource, error) {
	detectors := []resource.Option{
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", DefaultServiceName),
			attribute.String("service.version", buildinfo.Version()),
		),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	}
	if serviceName != "" {
		detectors = append(detectors, resource.WithAttributes(attribute.String("service.name", serviceName)))
	}
	return resource.New(ctx, detectors...)
}
