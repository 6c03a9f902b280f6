package llm

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names the spans this package starts.
const tracerName = "github.com/sluice-dev/sluice/pkg/llm"

// Attributes of a completion's span that the GenAI conventions have no
// name for.
const (
	// attrTTFT is the time from sending the request to the first token,
	// in milliseconds; the span also has a "gen_ai.first_token" event.
	attrTTFT = attribute.Key("sluice.llm.time_to_first_token_ms")
	// attrUsageReported is false when the backend sent no usage and
	// gen_ai.usage.output_tokens counts the streamed chunks instead.
	attrUsageReported = attribute.Key("sluice.llm.usage_reported")
	attrPool          = attribute.Key("sluice.pool")
)

// startSpan starts the client span of one completion, named and described
// as OpenTelemetry's GenAI conventions say ("chat <model>"). It never
// holds the messages or the answer.
func (c *OpenAI) startSpan(ctx context.Context, req Request) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		semconv.GenAIOperationNameChat, semconv.GenAIProviderNameOpenAI,
		semconv.GenAIRequestModel(req.Model), attrPool.String(c.name),
	}
	if req.MaxTokens > 0 {
		attrs = append(attrs, semconv.GenAIRequestMaxTokens(req.MaxTokens))
	}
	if req.Choices > 1 {
		attrs = append(attrs, semconv.GenAIRequestChoiceCount(req.Choices))
	}
	return c.tracer.Start(ctx, "chat "+req.Model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// spanEndpoint records which endpoint the completion went to.
func spanEndpoint(span trace.Span, endpoint string) {
	if !span.IsRecording() {
		return
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return
	}
	span.SetAttributes(semconv.ServerAddress(u.Hostname()))
	if port, err := strconv.Atoi(u.Port()); err == nil {
		span.SetAttributes(semconv.ServerPort(port))
	}
}

// spanFirstToken marks the first token on ctx's completion span.
func spanFirstToken(ctx context.Context, ttft time.Duration) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("gen_ai.first_token")
	span.SetAttributes(attrTTFT.Int64(ttft.Milliseconds()))
}

// endSpan records how the completion went and ends its span.
func endSpan(span trace.Span, res Result, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	if res.Model != "" {
		span.SetAttributes(semconv.GenAIResponseModel(res.Model))
	}
	if res.UsageReported {
		span.SetAttributes(semconv.GenAIUsageInputTokens(res.Usage.PromptTokens), semconv.GenAIUsageOutputTokens(res.Usage.CompletionTokens))
	} else if res.Chunks > 0 {
		span.SetAttributes(semconv.GenAIUsageOutputTokens(res.Chunks))
	}
	span.SetAttributes(attrUsageReported.Bool(res.UsageReported))
	switch {
	case len(res.Finishes) > 1:
		span.SetAttributes(semconv.GenAIResponseFinishReasons(res.Finishes...))
	case res.FinishReason != "":
		span.SetAttributes(semconv.GenAIResponseFinishReasons(res.FinishReason))
	}
	if err == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
}

// errorType is a failure's error.type: the HTTP status, the deadline that
// passed, a circuit open, a cancel, or _OTHER.
func errorType(err error) string {
	var e *Error
	var unavailable *UnavailableError
	switch {
	case errors.As(err, &e) && e.Deadline != "":
		return e.Deadline
	case errors.As(err, &e) && e.Status != 0:
		return strconv.Itoa(e.Status)
	case errors.As(err, &unavailable):
		return "circuit_open"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "_OTHER"
}
