package files

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
)

// Open reads tenant's file id from its start, a chunk at a time: the
// reader holds one chunk, whatever the file's size. Close it when done.
func (s *Store) Open(ctx context.Context, tenant, id string) (io.ReadCloser, error) {
	if _, err := s.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	return &reader{s: s, ctx: ctx, id: id}, nil
}

// reader reads a file's chunks in order.
type reader struct {
	s    *Store
	ctx  context.Context
	id   string
	seq  int
	data []byte
	eof  bool
}

func (r *reader) Read(p []byte) (int, error) {
	for len(r.data) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// next reads the next chunk; past the last, the reader is at its end. A
// file deleted meanwhile reads as cut short, an error, not as its end.
func (r *reader) next() error {
	var data string
	err := r.s.db.SQL.QueryRowContext(r.ctx, r.s.db.Dialect.Rebind(`SELECT data FROM file_chunks WHERE file_id = ? AND seq = ?`), r.id, r.seq).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		var deleted bool
		if err := r.s.db.SQL.QueryRowContext(r.ctx, r.s.db.Dialect.Rebind(`SELECT status = 'deleted' FROM files WHERE id = ?`), r.id).Scan(&deleted); err != nil || deleted {
			return fmt.Errorf("read file %s: it was deleted while it was read", r.id)
		}
		r.eof = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("read file %s, chunk %d: %w", r.id, r.seq, err)
	}
	r.seq++
	r.data = []byte(data)
	return nil
}

func (r *reader) Close() error { return nil }
