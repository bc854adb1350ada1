"""Learning: features, estimators, policy search, evaluation, the nightly job (issue 6)."""
