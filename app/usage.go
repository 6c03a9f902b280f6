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
// their workflows (RecordUsage retries) until it is back.
func openUsage(ctx context.Context, cfg config.Usage, logger *slog.Logger) (usage.Store, error) {
	s, err := openDatabase(ctx, "usage", cfg.Database, usage.OpenSQLite, usage.OpenPostgres)
	if s == nil || err != nil {
		return nil, err
	}
	if cfg.Store == config.UsagePostgres {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := s.Migrate(mctx); err != nil {
			logger.Warn("usage ledger out of reach at start; requests are answered and recorded once it is back", "err", err)
		}
	}
	return s, nil
}

// openResponses opens the response store cfg names (nil when off). A
// PostgreSQL store out of reach at start is migrated on first use.
func openResponses(ctx context.Context, cfg config.Responses) (*responses.Store, error) {
	return openDatabase(ctx, "responses", cfg.Database, responses.OpenSQLite, responses.OpenPostgres)
}

// openDatabase opens the records of config section section where db
// says, with sqlite or postgres (the records' own openers); nil when the
// store is off. A SQLite file's folder is made first; errors name the
// setting at fault.
func openDatabase[S any](ctx context.Context, section string, db config.Database,
	sqlite func(context.Context, sqldb.SQLiteOptions) (*S, error), postgres func(dsn string) (*S, error)) (*S, error) {
	switch db.Store {
	case config.StoreSQLite:
		if err := os.MkdirAll(filepath.Dir(db.SQLitePath), 0o750); err != nil {
			return nil, fmt.Errorf("%s.sqlite_path: %w", section, err)
		}
		s, err := sqlite(ctx, sqldb.SQLiteOptions{Path: db.SQLitePath})
		if err != nil {
			return nil, fmt.Errorf("%s.sqlite_path: %w", section, err)
		}
		return s, nil
	case config.StorePostgres:
		s, err := postgres(db.PostgresDSN)
		if err != nil {
			return nil, fmt.Errorf("%s.postgres_dsn: %w", section, err)
		}
		return s, nil
	}
	return nil, nil
}
