package worker

import (
	"os"
	"testing"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}
