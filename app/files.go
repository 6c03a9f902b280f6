package app

import (
	"context"
	"time"
)

// Expired files are hidden from every read at once; this sweep frees
// their content: every filesSweepEvery, up to filesSweepBatch files a
// round, rounds following on while each finds a full batch.
const (
	filesSweepEvery = time.Minute
	filesSweepBatch = 1000
)

// sweepFiles deletes expired files until ctx ends. Several workers may
// sweep one store: a file one of them deleted the others pass over.
func (c *Core) sweepFiles(ctx context.Context) {
	t := time.NewTicker(filesSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := c.Files.DeleteExpired(ctx, time.Now(), filesSweepBatch)
			if err != nil {
				if ctx.Err() == nil {
					c.logger.Warn("delete expired files", "err", err)
				}
				break
			}
			if n > 0 {
				c.logger.Info("deleted expired files", "files", n)
			}
			if n < filesSweepBatch {
				break
			}
		}
	}
}
