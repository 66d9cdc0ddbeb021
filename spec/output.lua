-- busted output: the plain terminal report, then the closing line CI reads:
-- "N passed, N failed, N skipped" (skipped = GPU specs on a machine without a GPU).
return function(options)
  local busted = require 'busted'
  local handler = require 'busted.outputHandlers.plainTerminal'(options)
  busted.subscribe({ 'suite', 'end' }, function()
    io.write(("\n%d passed, %d failed, %d skipped\n"):format(handler.successesCount,
      handler.failuresCount + handler.errorsCount, handler.pendingsCount))
    io.flush()
    return nil, true
  end)
  return handler
end
