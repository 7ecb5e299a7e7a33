"""Page layouts: runs list, run page, compare page (pure component trees; data comes from callbacks)."""
