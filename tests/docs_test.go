package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	mdFence   = regexp.MustCompile("(?s)```.*?```")
)

// TestDocLinks: every relative link in README.md and docs/*.md resolves
// in a clone of the repository — the file or directory exists, no link
// climbs out of it with ../, and an #anchor names a heading of the page it
// points to (GitHub's slugs). A link to code from docs/ starts at the
// repository's root: /fsm/table.go.
func TestDocLinks(t *testing.T) {
	root := filepath.Dir(testsDir())
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	pages = append(pages, filepath.Join(root, "README.md"))
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		text := mdFence.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(link, "#")
			target := page
			switch {
			case strings.HasPrefix(path, "/"): // from the repository's root, as GitHub reads it
				target = filepath.Join(root, path)
			case path != "":
				target = filepath.Join(filepath.Dir(page), path)
			}
			if path != "" {
				assert.NotContains(t, path, "../", "%s: %s climbs out of docs/; start at the repository's root (/…)", filepath.Base(page), link)
				rel, err := filepath.Rel(root, target)
				require.NoError(t, err)
				if !assert.False(t, strings.HasPrefix(rel, ".."), "%s: %s points outside the repository", filepath.Base(page), link) {
					continue
				}
				if _, err := os.Stat(target); !assert.NoError(t, err, "%s: %s", filepath.Base(page), link) {
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") {
				assert.Contains(t, anchors(t, target), anchor, "%s: %s names no heading", filepath.Base(page), link)
			}
		}
	}
}

// anchors are the slugs GitHub gives the headings of a page.
func anchors(t *testing.T, page string) []string {
	b, err := os.ReadFile(page)
	require.NoError(t, err)
	var out []string
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(string(b), ""), -1) {
		var s strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				s.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				s.WriteRune(r)
			}
		}
		out = append(out, s.String())
	}
	return out
}
