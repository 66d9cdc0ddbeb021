-- busted output: the plain terminal report, then the closing line CI reads:
-- "N passed, N failed, N skipped" (skipped = GPU specs on a machine without a GPU). With
-- CUDALUA_SPEC_TALLY set, the three numbers are also added as a line to that file (make test
-- runs two passes and closes with their sum).
return function(options)
  local busted = require 'busted'
  local handler = require 'busted.outputHandlers.plainTerminal'(options)
  busted.subscribe({ 'suite', 'end' }, function()
    io.write(("\n%d passed, %d failed, %d skipped\n"):format(handler.successesCount,
      handler.failuresCount + handler.errorsCount, handler.pendingsCount))
    io.flush()
    local tally = os.getenv("CUDALUA_SPEC_TALLY")
    local f = tally and io.open(tally, "a")
    if f then
      f:write(("%d %d %d\n"):format(handler.successesCount, handler.failuresCount + handler.errorsCount,
        handler.pendingsCount))
      f:close()
    end
    return nil, true
  end)
  return handler
end
