-- A key's overrides of its rule's limits, its pause and adaptive level (the prelude's
-- OVERRIDES field), as the state's HMGET read them.

-- The entity's overrides (an empty table, NO_OVERRIDES, for none: most entities) and its frontier,
-- carrying over an entity an earlier version wrote: its frontier was 'last' and its overrides a
-- hash of their own (commit_entity writes both the new way).
local function read_overrides(e, values)
  local tail = STATE_HEAD + 2 * #e.limits
  local blob, legacy_last = values[tail + STATE_OVERRIDES], values[tail + STATE_LEGACY_FRONTIER]
  if not values[STATE_FRONTIER] and legacy_last then
    e.overrides = parse_overrides(blob)
    e.folded = true
    fold_legacy_overrides(KEYS[e.base + KEY_LEGACY_OVERRIDES], e.overrides)
    return tonumber(legacy_last)
  elseif blob then
    e.overrides = parse_overrides(blob)
  else
    e.overrides = NO_OVERRIDES
  end
  return tonumber(values[STATE_FRONTIER])
end
