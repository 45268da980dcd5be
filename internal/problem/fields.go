package problem

import (
	"net/http"
	"strings"
)

// FieldError is one invalid member of a request body: a JSON Pointer
// (RFC 6901) to it and what is wrong with it. A problem lists them in its
// errors extension member (RFC 9457 §3.2), so that a client can mark every
// field at once instead of learning them one request at a time.
type FieldError struct {
	Pointer string `json:"pointer"`
	Detail  string `json:"detail"`
}

// Fields collects the invalid fields of one request body.
type Fields []FieldError

// Add records that the member at pointer is invalid, for detail.
func (f *Fields) Add(pointer, detail string) { *f = append(*f, FieldError{pointer, detail}) }

// Err is nil when no field was added, and otherwise the 400 invalid-input
// whose detail joins every field's and whose errors list them.
func (f Fields) Err() error {
	if len(f) == 0 {
		return nil
	}
	details := make([]string, len(f))
	for i, e := range f {
		details[i] = e.Detail
	}
	return &Error{Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input",
		Detail: strings.Join(details, "; "), Fields: f}
}

// pointer is the JSON Pointer of a dotted field path from encoding/json.
func pointer(field string) string {
	r := strings.NewReplacer("~", "~0", "/", "~1")
	parts := strings.Split(field, ".")
	for i, p := range parts {
		parts[i] = r.Replace(p)
	}
	return "/" + strings.Join(parts, "/")
}
