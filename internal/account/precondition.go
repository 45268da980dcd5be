package account

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lockbench/shop/internal/problem"
)

// Precondition is what a deposit or withdrawal requires of its account's
// version, from the If-Match header (RFC 9110 section 13.1.1): the client
// sends back the ETag it read, and the change is written only while the
// account is still at that version, else ErrPreconditionFailed and nothing
// is written. So a retry of a change that already applied is refused, not
// applied twice, even without an Idempotency-Key; and of two clients that
// send the same version, one applies. The zero Precondition requires
// nothing.
type Precondition struct {
	required bool
	versions []uint64
	// tags are the entity-tags as the client sent them, for the detail.
	tags string
}

// IfVersion requires the account to be at one of versions; with none, no
// version will do.
func IfVersion(versions ...uint64) Precondition {
	tags := make([]string, len(versions))
	for i, v := range versions {
		tags[i] = ETag(v)
	}
	return Precondition{required: true, versions: versions, tags: strings.Join(tags, ", ")}
}

// ETag is the entity-tag of an account at version: strong, the version in
// decimal. The version moves with every write of the balance.
func ETag(version uint64) string { return `"` + strconv.FormatUint(version, 10) + `"` }

// apply refuses a unless it is at a version p names, and pins a's write to
// the version read: the write lands only over that version, whatever the
// lock (the none baseline included), so two changes that both read it
// cannot both land.
func (p Precondition) apply(a *Account) error {
	if !p.required {
		return nil
	}
	for _, v := range p.versions {
		if v == a.Version {
			a.pinned = true
			return nil
		}
	}
	return fmt.Errorf("%w: account %d is at ETag %s; If-Match asks for %s", ErrPreconditionFailed, a.ID, ETag(a.Version), p.tags)
}

// ParseIfMatch reads the If-Match header fields of a request: absent or
// "*" require nothing (the account exists, or the answer is 404 anyway);
// otherwise a list of entity-tags. Weak tags and tags that are no version
// of ours are well-formed but never match (If-Match compares strongly),
// which ends in 412. Anything else is a 400 problem.
func ParseIfMatch(fields []string) (Precondition, error) {
	if len(fields) == 0 {
		return Precondition{}, nil
	}
	raw := strings.TrimSpace(strings.Join(fields, ", "))
	if raw == "*" {
		return Precondition{}, nil
	}
	p := Precondition{required: true, tags: raw}
	rest := raw
	found := false
	for {
		rest = strings.TrimLeft(rest, " \t,")
		if rest == "" {
			break
		}
		tag, after, err := entityTag(rest)
		if err != nil {
			return Precondition{}, problem.BadRequest(fmt.Sprintf(
				`If-Match must be "*" or a list of entity-tags such as "7" (the ETag of GET /api/v1/accounts/{id}): %s in %q`, err, raw))
		}
		found = true
		if v, ok := version(tag); ok {
			p.versions = append(p.versions, v)
		}
		rest = strings.TrimLeft(after, " \t")
		if rest != "" && rest[0] != ',' {
			return Precondition{}, problem.BadRequest(fmt.Sprintf("If-Match: entity-tags must be separated by commas, got %q", raw))
		}
	}
	if !found {
		return Precondition{}, problem.BadRequest(`If-Match is empty: send "*" or the ETag of GET /api/v1/accounts/{id}`)
	}
	return p, nil
}

// entityTag cuts one entity-tag (RFC 9110 section 8.8.3) from the front of
// s: [W/] DQUOTE *etagc DQUOTE. It returns the tag with its W/ and quotes.
func entityTag(s string) (tag, rest string, err error) {
	body := strings.TrimPrefix(s, "W/")
	if body == "" || body[0] != '"' {
		return "", "", fmt.Errorf("an entity-tag is quoted, %q is not", firstItem(s))
	}
	for i := 1; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '"':
			n := len(s) - len(body) + i + 1
			return s[:n], s[n:], nil
		case c == 0x21 || c >= 0x23 && c != 0x7f:
		default:
			return "", "", fmt.Errorf("byte %#02x is not allowed in an entity-tag", c)
		}
	}
	return "", "", fmt.Errorf("the entity-tag %q has no closing quote", firstItem(s))
}

// version is the account version a strong tag names: the exact text ETag
// sends, so "07" names none.
func version(tag string) (uint64, bool) {
	if strings.HasPrefix(tag, "W/") {
		return 0, false
	}
	v, err := strconv.ParseUint(tag[1:len(tag)-1], 10, 64)
	if err != nil || ETag(v) != tag {
		return 0, false
	}
	return v, true
}

func firstItem(s string) string {
	item, _, _ := strings.Cut(s, ",")
	return strings.TrimSpace(item)
}
