package sample

import (
	"os"
	"testing"
	"time"
)

func TestPasses(t *testing.T) { t.Log("quiet when it passes") }

// TestTakesAWhile passes slowly enough for the log to name it.
func TestTakesAWhile(t *testing.T) { time.Sleep(1100 * time.Millisecond) }

func TestFails(t *testing.T) {
	t.Run("ok", func(t *testing.T) {})
	t.Run("broken", func(t *testing.T) {
		t.Log("daemon log:\n{\"msg\":\"relayed noise\"}")
		t.Error("the pixel was black")
	})
}

func TestSkips(t *testing.T) { t.Skip("needs a thing") }

// TestDies ends the test binary without a result when SAMPLE_DIE is set.
func TestDies(t *testing.T) {
	if os.Getenv("SAMPLE_DIE") == "1" {
		os.Exit(3)
	}
}
