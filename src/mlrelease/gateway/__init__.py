"""The serving gateway: Feast lookup, value-density cohorts, routing between model versions, a fast guard."""
