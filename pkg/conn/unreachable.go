package conn

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/redis/go-redis/v9"
)

// Unreachable reports whether err says a dependency could not serve a
// call for now, rather than that the call was wrong. For Redis: no
// connection or a dropped one, a network timeout, a slot without a master
// while a cluster fails over (CLUSTERDOWN, TRYAGAIN), a master that lost
// its replicas (MASTERDOWN, NOREPLICAS), a node still loading its data, a
// demoted master refusing writes (READONLY), a full client table, or a
// client closed by a stopping process. For any other peer (an embedding
// or rerank service over HTTP): a network error. The same call may
// succeed in seconds; callers tell their client to retry (unavailable +
// Retry-After) instead of reporting an internal error.
//
// A context error is not: the caller's own deadline or cancel says why it
// stopped, whatever the peer was doing. go-redis retries most of these
// itself (MaxRetries) before returning them.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed),
		errors.As(err, &ne):
		return true
	}
	return redis.IsClusterDownError(err) || redis.IsTryAgainError(err) ||
		redis.IsMasterDownError(err) || redis.IsNoReplicasError(err) ||
		redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMaxClientsError(err)
}
