package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"time"

	"github.com/lockbench/shop/internal/auth"
)

// secrets are one row's credentials: random, so that nothing minted for a
// load test is accepted anywhere else.
type secrets struct {
	jwt, admin string
}

func newSecrets() secrets {
	return secrets{jwt: randomHex(32), admin: randomHex(24)}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux (Go 1.24+ panics instead)
	return hex.EncodeToString(b)
}

// userTokens are the bearer tokens of users 1..n, signed with the row's
// secret through the same code that verifies them in shop.
func (s secrets) userTokens(n int) ([]string, error) {
	a := auth.New([]byte(s.jwt), s.admin)
	now := time.Now()
	tokens := make([]string, n)
	for i := range tokens {
		tok, err := a.Token(int64(i+1), 2*time.Hour, now)
		if err != nil {
			return nil, err
		}
		tokens[i] = tok
	}
	return tokens, nil
}

// writeTokens writes the tokens of users 1..n for k6, which cannot sign
// HS256 without a remote jslib. The file is readable by its owner only
// and removed after the row; the secret dies with the run anyway.
func (s secrets) writeTokens(path string, n int) error {
	tokens, err := s.userTokens(n)
	if err != nil {
		return err
	}
	type entry struct {
		User  int64  `json:"user"`
		Token string `json:"token"`
	}
	list := make([]entry, n)
	for i, tok := range tokens {
		list[i] = entry{User: int64(i + 1), Token: tok}
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
