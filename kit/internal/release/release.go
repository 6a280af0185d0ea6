// Package release holds the kit's release, in a leaf that every package of
// the kit can import (the root package re-exports it as kit.Version).
package release

// Version is this kit's release, as its tag names it (kit/v0.3.0 in the
// template's repository): what scripts/new-project.sh --bare requires and
// scripts/kitproxy serves by default. A release changes it with the tag
// (docs/upgrading.md); a service's `version` command prints it beside the
// module version the binary was built from.
const Version = "v0.4.0"
