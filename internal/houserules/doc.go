// Package houserules holds tests that keep the rules of the house
// true: which packages may import which, what each binary links, how tests
// skip. The rules are written in docs/ARCHITECTURE.md, which names each
// test here (TestArchitectureNamesEveryRule keeps the two in step).
package houserules
