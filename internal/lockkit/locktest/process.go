package locktest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Environment of the helper processes the cross-process tests start.
const (
	envRole  = "LOCKTEST_HELPER"
	envKey   = "LOCKTEST_KEY"
	envFile  = "LOCKTEST_FILE"
	envIters = "LOCKTEST_ITERS"
	envTTL   = "LOCKTEST_TTL"
)

func (s *suite) crossProcess(t *testing.T) {
	if !s.caps.CrossProcess {
		// Absent as declared: while another process holds the key, this
		// one must be granted it too, or the declaration is wrong.
		_, kill := s.startHolder(t)
		defer kill()
		lease, err := s.open(t).TryAcquire(context.Background(), s.key(t), lockkit.WithTTL(10*time.Second))
		if err != nil {
			t.Fatalf("backend declares no cross-process exclusion, but was refused a key another process holds: %v", err)
		}
		_ = lease.Release(context.Background())
		return
	}
	const processes, iterations = 3, 20
	file := t.TempDir() + "/counter"
	if err := os.WriteFile(file, []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outputs := make([][]byte, processes)
	errs := make([]error, processes)
	for p := range processes {
		cmd := s.helper(t, "increment", file, iterations)
		wg.Go(func() { outputs[p], errs[p] = cmd.CombinedOutput() })
	}
	wg.Wait()
	for p := range processes {
		if errs[p] != nil {
			t.Fatalf("helper %d: %v\n%s", p, errs[p], outputs[p])
		}
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(processes * iterations); string(got) != want {
		t.Fatalf("counter = %s after %d processes x %d increments, want %s", got, processes, iterations, want)
	}
}

func (s *suite) expiryAfterCrash(t *testing.T) {
	key := s.key(t)
	if s.caps.CrossProcess {
		_, kill := s.startHolder(t)
		kill() // SIGKILL: no release, no goodbye to the server
	} else {
		l := s.h.New(t)
		mustTry(t, l, key, lockkit.WithTTL(s.h.TTL))
		// The holder "dies": its lease is never released.
		defer l.Close()
	}
	other := s.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), s.crashBound())
	defer cancel()
	lease, err := other.Acquire(ctx, key, lockkit.WithTTL(s.h.TTL))
	switch {
	case s.caps.Expires && err != nil:
		t.Fatalf("lock of a dead holder still not granted after %v: %v", s.crashBound(), err)
	case !s.caps.Expires && err == nil:
		_ = lease.Release(context.Background())
		t.Fatal("backend declares no expiry, but a dead holder's lock was granted to another client")
	case !s.caps.Expires && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Acquire of a dead holder's lock = %v, want it still held after %v", err, s.crashBound())
	case err == nil:
		_ = lease.Release(context.Background())
	}
}

// startHolder starts a helper process that acquires the test's key and
// holds it until killed; kill sends SIGKILL and reaps it.
func (s *suite) startHolder(t *testing.T) (cmd *exec.Cmd, kill func()) {
	t.Helper()
	cmd = s.helper(t, "hold", "", 0)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held") {
		kill()
		t.Fatalf("helper did not report holding the lock: %q %v", line, err)
	}
	return cmd, kill
}

// helper returns a command that re-runs the current top-level test as a
// helper process with role.
func (s *suite) helper(t *testing.T, role, file string, iterations int) *exec.Cmd {
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envRole+"="+role,
		envKey+"="+s.key(t),
		envFile+"="+file,
		envIters+"="+strconv.Itoa(iterations),
		envTTL+"="+s.h.TTL.String(),
	)
	return cmd
}

// runHelper is the helper process's side of the cross-process tests.
func runHelper(t *testing.T, h Harness, role string) {
	key := os.Getenv(envKey)
	ttl, _ := time.ParseDuration(os.Getenv(envTTL))
	l := h.New(t)
	ctx := context.Background()
	switch role {
	case "increment":
		n, _ := strconv.Atoi(os.Getenv(envIters))
		file := os.Getenv(envFile)
		for done := 0; done < n; {
			ran := false
			err := lockkit.Do(ctx, l, key, func(context.Context, uint64) error {
				ran = true
				// The marker exists only while some process is inside:
				// finding it is an overlap, even one that loses no update.
				inside, err := os.OpenFile(file+".inside", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if err != nil {
					return fmt.Errorf("two holders at once: %w", err)
				}
				_ = inside.Close()
				defer os.Remove(file + ".inside")
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				v, err := strconv.Atoi(string(b))
				if err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
				return os.WriteFile(file, []byte(strconv.Itoa(v+1)), 0o600)
			}, lockkit.WithAutoRenew(ttl))
			if ran {
				done++
			}
			// A lease lost on a loaded machine is not two holders: the
			// marker file is what tells.
			if err != nil && !errors.Is(err, lockkit.ErrLeaseLost) {
				fmt.Fprintln(os.Stderr, "increment:", err)
				os.Exit(1)
			}
		}
		_ = l.Close()
		os.Exit(0)
	case "hold":
		if _, err := l.Acquire(ctx, key, lockkit.WithTTL(ttl)); err != nil {
			fmt.Fprintln(os.Stderr, "hold:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		select {} // until the parent kills us
	default:
		fmt.Fprintln(os.Stderr, "unknown helper role", role)
		os.Exit(2)
	}
}
