package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/lockbench/shop/internal/auth"
)

// Tokens are accepted by a shop with the row's secret as users 1..n, and
// by no shop with another row's.
func TestUserTokensAreTheUsersSignedWithTheRowsSecret(t *testing.T) {
	sec, other := newSecrets(), newSecrets()
	tokens, err := sec.userTokens(3)
	if err != nil || len(tokens) != 3 {
		t.Fatalf("%d tokens, %v", len(tokens), err)
	}
	for i, tok := range tokens {
		if user, err := auth.New([]byte(sec.jwt), sec.admin).Verify(tok); err != nil || user != int64(i+1) {
			t.Errorf("token %d is user %d (%v)", i, user, err)
		}
		if _, err := auth.New([]byte(other.jwt), other.admin).Verify(tok); err == nil {
			t.Errorf("token %d is accepted with another row's secret", i)
		}
	}
}

// k6 reads the tokens from a file only the runner's user can read.
func TestWriteTokensWritesAFileOnlyItsOwnerReads(t *testing.T) {
	sec := newSecrets()
	path := filepath.Join(t.TempDir(), "tokens.json")
	if err := sec.writeTokens(path, 2); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", info.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	var list []struct {
		User  int64  `json:"user"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal(b, &list); err != nil || len(list) != 2 || list[0].User != 1 || list[1].User != 2 {
		t.Fatalf("file %s: %v", b, err)
	}
	if user, err := auth.New([]byte(sec.jwt), sec.admin).Verify(list[1].Token); err != nil || user != 2 {
		t.Errorf("user 2's token is user %d (%v)", user, err)
	}
}

// Each row draws its own; shop in production refuses a secret or an
// admin token under 32 bytes, or the one used as the other.
func TestSecretsAreRandomAndFitForProduction(t *testing.T) {
	a, b := newSecrets(), newSecrets()
	if a.jwt == b.jwt || a.admin == b.admin {
		t.Error("two rows drew the same secret")
	}
	if len(a.jwt) < 32 || len(a.admin) < 32 || a.jwt == a.admin {
		t.Errorf("secret of %d bytes, admin token of %d, equal %v", len(a.jwt), len(a.admin), a.jwt == a.admin)
	}
}
