package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/responses"
	"github.com/sluice-dev/sluice/pkg/sqldb"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// openUsage opens the usage ledger cfg names and brings its schema up to
// date; nil with usage.store off. The API reads it, the worker writes it:
// both open the same one. A PostgreSQL ledger out of reach does not stop
// the process: requests go on being answered, and their records wait in
// their workflows until it is back (the store migrates on first use).
func openUsage(ctx context.Context, cfg config.Usage, logger *slog.Logger) (usage.Store, error) {
	switch cfg.Store {
	case config.UsageSQLite:
		if err := os.MkdirAll(filepath.Dir(cfg.SQLitePath), 0o750); err != nil {
			return nil, fmt.Errorf("usage.sqlite_path: %w", err)
		}
		s, err := usage.OpenSQLite(ctx, usage.SQLiteOptions{Path: cfg.SQLitePath})
		if err != nil {
			return nil, fmt.Errorf("usage.sqlite_path: %w", err)
		}
		return s, nil
	case config.UsagePostgres:
		s, err := usage.OpenPostgres(cfg.PostgresDSN)
		if err != nil {
			return nil, fmt.Errorf("usage.postgres_dsn: %w", err)
		}
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := s.Migrate(mctx); err != nil {
			logger.Warn("usage ledger out of reach at start; requests are answered and recorded once it is back", "err", err)
		}
		return s, nil
	}
	return nil, nil
}

// openResponses opens the response store cfg names (nil when off). A
// PostgreSQL store out of reach at start is migrated on first use.
func openResponses(ctx context.Context, cfg config.Responses, logger *slog.Logger) (*responses.Store, error) {
	switch cfg.Store {
	case config.StoreSQLite:
		if err := os.MkdirAll(filepath.Dir(cfg.SQLitePath), 0o750); err != nil {
			return nil, fmt.Errorf("responses.sqlite_path: %w", err)
		}
		s, err := responses.OpenSQLite(ctx, sqldb.SQLiteOptions{Path: cfg.SQLitePath})
		if err != nil {
			return nil, fmt.Errorf("responses.sqlite_path: %w", err)
		}
		return s, nil
	case config.StorePostgres:
		s, err := responses.OpenPostgres(cfg.PostgresDSN)
		if err != nil {
			return nil, fmt.Errorf("responses.postgres_dsn: %w", err)
		}
		return s, nil
	}
	return nil, nil
}
