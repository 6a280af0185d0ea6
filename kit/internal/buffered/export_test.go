package buffered

import (
	"context"
	"database/sql"
)

// CompleteClaim exposes completeClaim to the tests: the second step of a
// claim, for keys its first statement leased without seeing their head.
func (s *Store) CompleteClaim(ctx context.Context, tx *sql.Tx, headless []string, token int64) ([]Claimed, error) {
	return s.completeClaim(ctx, tx, nil, headless, token)
}
