package model

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"go.uber.org/zap"
)

// DefaultBaseURL is the OpenAI API base URL used when neither Config.BaseURL
// nor OPENAI_BASE_URL is set.
const DefaultBaseURL = "https://api.openai.com/v1"

// Config configures an [OpenAI] model.
type Config struct {
	// Model is the default model name, used when a request names none.
	Model string
	// APIKey authenticates; empty means $OPENAI_API_KEY.
	APIKey string
	// BaseURL is the API root (".../v1"); empty means $OPENAI_BASE_URL, then
	// DefaultBaseURL. Point it at Azure or any OpenAI-compatible endpoint.
	BaseURL string
	// Organization and Project select the billing scope; empty means
	// $OPENAI_ORG_ID and $OPENAI_PROJECT_ID.
	Organization string
	Project      string
	// Headers are sent with every request (e.g. Azure's api-key, a gateway's
	// routing header), after those of $OPENAI_CUSTOM_HEADERS ("Name: value"
	// lines), which they override.
	Headers map[string]string
	// HTTPClient replaces the default HTTP client (http.DefaultTransport's
	// settings with a 10 minute limit on the wait for response headers; the
	// body of a stream has none).
	HTTPClient *http.Client
	// Retry is the retry policy; the SDK's own retries are always disabled.
	Retry RetryPolicy
	// Logger receives retry and failure logs (never keys or content); nil
	// means no logging.
	Logger *zap.Logger
}

// OpenAI is a [Model] on the OpenAI Responses API. It is safe for concurrent
// use.
type OpenAI struct {
	// responses is the SDK's Responses service alone: the SDK's root client
	// (openai.NewClient) would link every other API's types and their JSON
	// code into every binary embedding the harness.
	responses responses.ResponseService
	model     string
	apiKey    string
	retry     RetryPolicy
	log       *zap.Logger
}

var _ Model = (*OpenAI)(nil)

// NewOpenAI returns a model client for cfg, falling back on the OPENAI_*
// environment variables for what cfg leaves empty. It fails when no API key
// is configured.
func NewOpenAI(cfg Config) (*OpenAI, error) {
	key := firstNonEmpty(cfg.APIKey, os.Getenv("OPENAI_API_KEY"))
	if key == "" {
		return nil, errors.New("model: no OpenAI API key: set Config.APIKey or OPENAI_API_KEY")
	}
	base := firstNonEmpty(cfg.BaseURL, os.Getenv("OPENAI_BASE_URL"), DefaultBaseURL)
	httpClient := cfg.HTTPClient
	if httpClient == nil {
		httpClient = defaultHTTPClient()
	}
	// The options openai.NewClient would add from the environment are
	// resolved here: Config's fields first, then the OPENAI_* variables.
	opts := []option.RequestOption{
		option.WithHTTPClient(httpClient),
		option.WithBaseURL(base),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
	}
	if org := firstNonEmpty(cfg.Organization, os.Getenv("OPENAI_ORG_ID")); org != "" {
		opts = append(opts, option.WithOrganization(org))
	}
	if proj := firstNonEmpty(cfg.Project, os.Getenv("OPENAI_PROJECT_ID")); proj != "" {
		opts = append(opts, option.WithProject(proj))
	}
	for k, v := range customHeaders(os.Getenv("OPENAI_CUSTOM_HEADERS")) {
		opts = append(opts, option.WithHeader(k, v))
	}
	for k, v := range cfg.Headers { // set after: they win
		opts = append(opts, option.WithHeader(k, v))
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &OpenAI{
		responses: responses.NewResponseService(opts...),
		model:     cfg.Model,
		apiKey:    key,
		retry:     cfg.Retry.withDefaults(),
		log:       log.With(zap.String("component", "model.openai")),
	}, nil
}

// defaultResponseHeaderTimeout bounds the wait between a written request and
// the response headers (what the SDK's own default client does): a server
// that accepts the connection and never answers fails the attempt, which is
// retried. The body of a stream has no limit.
const defaultResponseHeaderTimeout = 10 * time.Minute

// defaultHTTPClient is the client used when Config.HTTPClient is nil:
// http.DefaultTransport's settings plus defaultResponseHeaderTimeout, or
// http.DefaultTransport itself when something replaced it (otelhttp).
func defaultHTTPClient() *http.Client {
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t = t.Clone()
		t.ResponseHeaderTimeout = defaultResponseHeaderTimeout
		return &http.Client{Transport: t}
	}
	return &http.Client{Transport: http.DefaultTransport}
}

// customHeaders parses $OPENAI_CUSTOM_HEADERS the way the SDK's root client
// does: one "Name: value" per line; lines without a colon are ignored.
func customHeaders(env string) map[string]string {
	if env == "" {
		return nil
	}
	h := map[string]string{}
	for line := range strings.SplitSeq(env, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if name = strings.TrimSpace(name); ok && name != "" {
			h[name] = strings.TrimSpace(value)
		}
	}
	return h
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// ProviderName returns "openai" (gen_ai.provider.name; see ProviderNamer).
func (m *OpenAI) ProviderName() string { return "openai" }

// Stream implements [Model]. See [Model.Stream] for the retry contract: a
// failure before any event was yielded is retried silently; a failure after
// events were yielded is retried after an EventReset. Output items of hosted
// tools (web search, ...) are not requested by the harness and are dropped.
func (m *OpenAI) Stream(ctx context.Context, req *Request) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		name := firstNonEmpty(req.Model, m.model)
		params, err := buildParams(name, req)
		if err != nil {
			yield(Event{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()

		for attempt := 1; ; attempt++ {
			res, delivered, failure, stopped := m.attempt(ctx, params, yield)
			if stopped {
				return
			}
			if failure == nil {
				res.Attempts = attempt
				yield(Event{Kind: EventCompleted, Response: res}, nil)
				return
			}
			if ctx.Err() != nil {
				yield(Event{}, fmt.Errorf("model: openai responses call cancelled: %w", ctx.Err()))
				return
			}
			failure.Attempts = attempt
			log := m.log.With(zap.String("model", name), zap.Int("attempt", attempt),
				zap.Int("status", failure.StatusCode), zap.String("request_id", failure.RequestID))
			if !failure.Retryable || attempt >= m.retry.MaxAttempts {
				log.Warn("model call failed", zap.Bool("retryable", failure.Retryable))
				yield(Event{}, failure.finish(m.apiKey))
				return
			}
			if failure.RetryAfter > m.retry.MaxRetryAfter {
				log.Warn("model call failed: server asks to wait longer than allowed",
					zap.Duration("retry_after", failure.RetryAfter))
				yield(Event{}, failure.finish(m.apiKey))
				return
			}
			delay := m.retry.delay(attempt, failure.RetryAfter)
			failure.finish(m.apiKey)
			log.Info("retrying model call", zap.Duration("delay", delay), zap.String("reason", failure.Error()))
			if delivered {
				if !yield(Event{Kind: EventReset, Reset: &Reset{Attempt: attempt + 1, Err: failure}}, nil) {
					return
				}
			}
			if err := m.retry.Sleep(ctx, delay); err != nil {
				yield(Event{}, fmt.Errorf("model: openai responses call cancelled while waiting to retry: %w", err))
				return
			}
		}
	}
}

// attempt makes one streaming request. It returns the completed response, or
// the failure, and whether anything was yielded; stopped is true when the
// consumer stopped the iteration.
func (m *OpenAI) attempt(ctx context.Context, params responses.ResponseNewParams,
	yield func(Event, error) bool) (res *Response, delivered bool, failure *APIError, stopped bool) {
	var httpRes *http.Response
	stream := m.responses.NewStreaming(ctx, params, option.WithResponseInto(&httpRes))
	defer func() { _ = stream.Close() }()

	emit := func(ev Event) bool {
		delivered = true
		return yield(ev, nil)
	}
	var items []Item
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			if !emit(Event{Kind: EventTextDelta, ItemID: ev.ItemID, OutputIndex: int(ev.OutputIndex), Delta: ev.Delta}) {
				return nil, delivered, nil, true
			}
		case "response.reasoning_summary_text.delta":
			if !emit(Event{Kind: EventReasoningDelta, ItemID: ev.ItemID, OutputIndex: int(ev.OutputIndex), Delta: ev.Delta}) {
				return nil, delivered, nil, true
			}
		case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
			if !emit(Event{Kind: EventToolCallDelta, ItemID: ev.ItemID, OutputIndex: int(ev.OutputIndex), Delta: ev.Delta}) {
				return nil, delivered, nil, true
			}
		case "response.output_item.done":
			it, ok := outputItem(ev.Item)
			if !ok {
				m.log.Debug("ignoring output item", zap.String("type", ev.Item.Type))
				continue
			}
			items = append(items, it)
			if !emit(Event{Kind: EventItemDone, ItemID: it.ID, OutputIndex: int(ev.OutputIndex), Item: &it}) {
				return nil, delivered, nil, true
			}
		case "response.completed", "response.incomplete":
			return completed(ev.Response, items), delivered, nil, false
		case "response.failed":
			e := ev.Response.Error
			return nil, delivered, &APIError{
				RequestID: requestID(httpRes), Code: string(e.Code), Message: e.Message,
				Retryable: retryableCode(string(e.Code)), cause: errors.New("response failed"),
			}, false
		case "error":
			return nil, delivered, &APIError{
				RequestID: requestID(httpRes), Code: ev.Code, Message: ev.Message,
				Retryable: retryableCode(ev.Code), cause: errors.New("error event in stream"),
			}, false
		}
	}
	return nil, delivered, classify(stream.Err(), httpRes), false
}

// completed builds the response from the terminal event, falling back on the
// streamed items when the terminal event carries no output (some compatible
// servers omit it).
func completed(r responses.Response, streamed []Item) *Response {
	res := &Response{
		ID: r.ID, Model: r.Model, Status: string(r.Status),
		IncompleteReason: r.IncompleteDetails.Reason, Usage: usageOf(r.Usage),
	}
	if res.Status == "" {
		res.Status = "completed"
	}
	for _, o := range r.Output {
		if it, ok := outputItem(o); ok {
			res.Output = append(res.Output, it)
		}
	}
	if len(r.Output) == 0 {
		res.Output = streamed
	}
	return res
}

func requestID(r *http.Response) string {
	if r == nil {
		return ""
	}
	return r.Header.Get("x-request-id")
}

// classify turns the error that ended a stream into a failure.
func classify(err error, httpRes *http.Response) *APIError {
	var apiErr *responses.Error
	var streamErr *ssestream.StreamError
	switch {
	case err == nil:
		return &APIError{RequestID: requestID(httpRes), Retryable: true, cause: ErrStreamInterrupted}
	case errors.As(err, &apiErr):
		ae := &APIError{
			StatusCode: apiErr.StatusCode, Type: apiErr.Type, Code: apiErr.Code, Message: apiErr.Message,
			Retryable: retryableStatus(apiErr.StatusCode), cause: err,
		}
		if apiErr.Response != nil {
			h := apiErr.Response.Header
			ae.RequestID = h.Get("x-request-id")
			ae.RetryAfter = retryAfter(h, time.Now())
			switch strings.ToLower(h.Get("x-should-retry")) {
			case "true":
				ae.Retryable = true
			case "false":
				ae.Retryable = false
			}
		}
		if ae.Message == "" {
			ae.Message = strings.TrimSpace(apiErr.RawJSON())
		}
		return ae
	case errors.As(err, &streamErr):
		return &APIError{RequestID: requestID(httpRes), Message: streamErr.Message, cause: err}
	case httpRes == nil:
		// No answer at all: refused or reset connection, DNS, TLS.
		return &APIError{Retryable: true, cause: fmt.Errorf("connection failed: %w", err)}
	default:
		// The answer broke off: body cut short, undecodable event.
		return &APIError{RequestID: requestID(httpRes), Retryable: true,
			cause: fmt.Errorf("%w: %w", ErrStreamInterrupted, err)}
	}
}
