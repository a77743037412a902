"""The commit this copy of the package was archived from: `git archive` substitutes the placeholder below (see
.gitattributes, `export-subst`); in a git checkout it stays a placeholder and the commit is read from git instead
(`experiments.confirmatory.provenance`)."""

ARCHIVED_COMMIT = "$Format:%H$"
