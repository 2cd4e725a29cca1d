package skills

import (
	"strings"
)

// indexIntro opens the fragment.
const indexIntro = "Skills are packaged instructions for particular kinds of work. Each skill is a directory " +
	"whose `SKILL.md` says when and how to use it, sometimes with scripts, references or assets next to it. " +
	"The list gives each skill's name, what it is for, and its directory (relative to the workspace root)."

// lazySection is added in lazy mode.
var lazySection = []string{
	"### Lazy loading",
	"- The skills above are indexed but not yet in the workspace: their directories appear when you load them.",
	"- Before using a skill, call `load_skill` with its name. It copies that one skill into its directory and " +
		"returns the instructions of its `SKILL.md`; call it once for each skill you need.",
	"- Loading a skill that is already in the workspace changes nothing and returns its instructions again.",
}

// usage is the common part of the closing section; first is its opening
// step, which differs between the modes.
func usage(first string) []string {
	return []string{
		"### How to use skills",
		"- Use a skill when the user names it, or when the task clearly matches its description. If several apply, " +
			"use the smallest set that covers the task and say in one line which ones you use and why.",
		first,
		"- Paths in a skill's instructions (`scripts/`, `references/`, `assets/`) are relative to the skill's " +
			"directory, not to your working directory.",
		"- Open other files of a skill only when its instructions point to them and the task needs them. " +
			"Run a skill's scripts rather than retyping them, and reuse its templates and assets.",
		"- Leave skill directories as they are unless the task is to change a skill: keep your inputs, outputs " +
			"and scratch files in your working directory.",
		"- If a skill is missing, cannot be read, or does not fit the task, say so briefly and continue with the " +
			"best alternative.",
	}
}

// index renders the instruction fragment: the skills sorted by name, one
// line each ("- <name>: <description> (file: <directory>)"), then how to
// load and use them.
func (s *Skills) index() string {
	lines := []string{"## Skills", indexIntro, "### Available skills"}
	for _, b := range s.bundles {
		lines = append(lines, "- "+b.name+": "+b.description+" (file: "+s.dir(b)+")")
	}
	if s.opts.Mode == Lazy {
		lines = append(lines, lazySection...)
		lines = append(lines, usage("- To use a skill, load it with `load_skill` and follow the instructions it returns; "+
			"they are also in `SKILL.md` in the skill's directory.")...)
	} else {
		lines = append(lines, usage("- To use a skill, read its `SKILL.md` first, and only as much of it as you need "+
			"to follow it.")...)
	}
	return strings.Join(lines, "\n")
}
