package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDescribe(t *testing.T) {
	tests := []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"work tree, no vcs", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"release", debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0"},
		{"work tree with revision", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "3f2a1b0c9d1e5566778899aabbccddeeff001122"}, {Key: "vcs.modified", Value: "false"}}}, "devel+3f2a1b0c9d1e"},
		{"uncommitted changes", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}, "devel+abc+dirty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, describe(&tt.info))
		})
	}
	assert.NotEmpty(t, Version())
}
