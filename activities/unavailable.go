package activities

import (
	"context"
	"errors"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/conn"
)

// UnavailableInterceptor marks every activity error that says a
// dependency was out of reach (conn.Unreachable: Redis failing over or
// restarting, a network error to an embedding service) as an
// ErrTypeDependencyUnavailable application error, still retryable. It is
// one place for what would otherwise be a check at each of the dozens of
// Redis calls the activities make; local activities pass through it too.
// Errors that already say what they are (application errors, cancels)
// pass unchanged.
func UnavailableInterceptor() interceptor.WorkerInterceptor { return &unavailableWorker{} }

type unavailableWorker struct {
	interceptor.WorkerInterceptorBase
}

func (*unavailableWorker) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &unavailableActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}}
}

type unavailableActivity struct {
	interceptor.ActivityInboundInterceptorBase
}

func (a *unavailableActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	out, err := a.Next.ExecuteActivity(ctx, in)
	return out, markUnavailable(ctx, err)
}

// markUnavailable is the interceptor's rule: err, or err marked
// ErrTypeDependencyUnavailable when a dependency was out of reach and the
// activity itself was not stopped.
func markUnavailable(ctx context.Context, err error) error {
	var appErr *temporal.ApplicationError
	if err == nil || ctx.Err() != nil || errors.As(err, &appErr) || !conn.Unreachable(err) {
		return err
	}
	return temporal.NewApplicationErrorWithCause(err.Error(), ErrTypeDependencyUnavailable, err)
}
