package errcode

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNamesRoundTrip(t *testing.T) {
	for c, n := range names {
		got, ok := Parse(n)
		assert.True(t, ok, n)
		assert.Equal(t, c, got)
		assert.Equal(t, n, c.String())
	}
	assert.Equal(t, "CODE(-9999)", Code(-9999).String())
	_, ok := Parse("NO_SUCH_CODE")
	assert.False(t, ok)
}

func TestOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Code
	}{
		{"nil", nil, OK},
		{"plain", errors.New("boom"), InternalError},
		{"direct", New(ObjectNotFound, "key %q", "k"), ObjectNotFound},
		{"wrapped", fmt.Errorf("ctx: %w", New(ObjectHasLease, "x")), ObjectHasLease},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Of(tt.err))
		})
	}
	assert.Equal(t, `OBJECT_NOT_FOUND: key "k"`, New(ObjectNotFound, "key %q", "k").Error())
	assert.Equal(t, "OBJECT_NOT_FOUND", (&Error{Code: ObjectNotFound}).Error())
}
