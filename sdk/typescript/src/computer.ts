/**
 * Loosely typed request and answer shapes of the vendor computer-use
 * endpoints, which run a model's tool call on a sandbox's desktop in the
 * model vendor's own format. Only the fields the daemon reads or writes
 * are named; everything else passes through untouched.
 */

/** How the vendor endpoints encode the screenshots they answer with. */
export interface ComputerImageOptions {
  /** png (default) or jpeg. */
  format?: "png" | "jpeg";
  /** JPEG quality, 1..100. */
  quality?: number;
  /** Take each observing screenshot only once the screen has not changed for this long (at most settle_max_ms). */
  settle_ms?: number;
  settle_max_ms?: number;
  [field: string]: unknown;
}

/** Anthropic's computer-use tool definition, e.g. {"type": "computer_20251124", "name": "computer", "display_width_px": 1024, "display_height_px": 768}. */
export interface AnthropicComputerTool {
  type: string;
  name: string;
  display_width_px?: number;
  display_height_px?: number;
  display_number?: number;
  enable_zoom?: boolean;
  [field: string]: unknown;
}

/** A tool_use content block of an Anthropic message. */
export interface AnthropicToolUse {
  type?: "tool_use";
  id: string;
  name: string;
  /** The tool's input, e.g. {"action": "left_click", "coordinate": [100, 200]}. */
  input: Record<string, unknown>;
  [field: string]: unknown;
}

/** A content block of a tool_result: text or a base64 image. */
export type AnthropicContentBlock =
  | { type: "text"; text: string; [field: string]: unknown }
  | {
      type: "image";
      source: { type: "base64"; media_type: string; data: string; [field: string]: unknown };
      [field: string]: unknown;
    }
  | { type: string; [field: string]: unknown };

/** A tool_result content block, ready to go back to the model. */
export interface AnthropicToolResult {
  type: "tool_result";
  tool_use_id?: string;
  content: AnthropicContentBlock[];
  is_error?: boolean;
  [field: string]: unknown;
}

/** Runs one tool_use input. */
export interface AnthropicComputerInputRequest {
  tool?: AnthropicComputerTool;
  input: Record<string, unknown>;
  /** Answer an action that reports nothing of its own with a screenshot taken after it (default true). */
  observe?: boolean;
  image?: ComputerImageOptions;
  [field: string]: unknown;
}

/** Runs the tool_use blocks of a model turn, in order. */
export interface AnthropicComputerBatchRequest {
  tool?: AnthropicComputerTool;
  tool_uses: AnthropicToolUse[];
  observe?: boolean;
  image?: ComputerImageOptions;
  [field: string]: unknown;
}

/** The answer to an {@link AnthropicComputerBatchRequest}: one tool_result per tool_use. */
export interface AnthropicComputerBatchResponse {
  tool_results: AnthropicToolResult[];
  [field: string]: unknown;
}

/** OpenAI's computer-use tool definition, e.g. {"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "linux"}. */
export interface OpenAIComputerTool {
  type: string;
  display_width?: number;
  display_height?: number;
  environment?: string;
  [field: string]: unknown;
}

/** A pending safety check of a computer_call. */
export interface OpenAISafetyCheck {
  id: string;
  code?: string;
  message?: string;
  [field: string]: unknown;
}

/** A computer_call output item of the OpenAI Responses API: one action, or a batch of them. */
export interface OpenAIComputerCall {
  type?: "computer_call";
  call_id: string;
  id?: string;
  status?: string;
  /** e.g. {"type": "click", "x": 100, "y": 200, "button": "left"}. */
  action?: { type: string; [field: string]: unknown };
  actions?: { type: string; [field: string]: unknown }[];
  pending_safety_checks?: OpenAISafetyCheck[];
  [field: string]: unknown;
}

/** Runs one computer_call. */
export interface OpenAIComputerRequest {
  tool?: OpenAIComputerTool;
  computer_call: OpenAIComputerCall;
  /** Acknowledge the call's pending safety checks (they are refused otherwise). */
  acknowledge_safety_checks?: boolean;
  image?: ComputerImageOptions;
  [field: string]: unknown;
}

/** A computer_call_output input item, ready to go back to the model. */
export interface OpenAIComputerCallOutput {
  type: "computer_call_output";
  call_id: string;
  output: { type: "computer_screenshot"; image_url: string; [field: string]: unknown };
  acknowledged_safety_checks?: OpenAISafetyCheck[];
  [field: string]: unknown;
}
