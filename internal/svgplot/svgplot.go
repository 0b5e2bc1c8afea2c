// Package svgplot writes a grid of gonum plots as one SVG file: the
// latency curves of moonbench and the soak's resource plots.
package svgplot

import (
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteGrid draws panels (rows of equal length; an empty plot.New() fills
// a hole) into an SVG of width, each row rowHeight tall, at path.
func WriteGrid(path string, panels [][]*plot.Plot, width, rowHeight vg.Length) error {
	rows, cols := len(panels), len(panels[0])
	img := vgsvg.New(width, vg.Length(rows)*rowHeight)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(panels, tiles, draw.New(img))
	for j := range panels {
		for i := range panels[j] {
			panels[j][i].Draw(canvases[j][i])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
