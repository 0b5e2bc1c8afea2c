package fsm

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestProcIndexStartedBy(t *testing.T) {
	obj := func(ms int64) *object { return &object{putStartMs: ms, replicas: []replica{{status: Processing}}} }
	p := newProcIndex()
	p.set("b", obj(10))
	p.set("a", obj(10))
	p.set("c", obj(20))
	p.set("d", obj(30))
	p.remove("c")

	assert.Nil(t, p.startedBy(9), "nothing started by 9")
	assert.Equal(t, []procItem{{10, "a"}, {10, "b"}}, p.startedBy(25), "by start time, then key")
	p.remove("a")
	p.remove("b")
	assert.Equal(t, int64(30), p.oldestMs, "the scan raised the bound to the oldest left")
	assert.Nil(t, p.startedBy(29))
	p.set("e", obj(5)) // a restored snapshot may add older starts
	assert.Equal(t, []procItem{{5, "e"}, {30, "d"}}, p.startedBy(30))
	assert.Equal(t, []procItem{{5, "e"}, {30, "d"}}, p.sorted())
}
