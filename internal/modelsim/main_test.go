package modelsim_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any test leaves a goroutine behind: the server must join everything
// it starts by the time Close returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
