"""Statistical verdicts: anytime-valid confidence sequences and the contract every gate decides by."""
